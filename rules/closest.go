package rules

// Closest returns the word of known that word is most likely a misspelling
// of: the nearest by edit distance, within three edits (one for a word of
// up to four letters, where more would suggest anything); among equally
// near words, the one that sorts first. "" when none is that near. The
// configuration's "did you mean" hints, for variables, rule fields and
// envoyproxy/ratelimit keys alike, come from it.
func Closest(word string, known []string) string {
	best, bestD := "", 4
	if len(word) <= 4 {
		bestD = 2
	}
	for _, k := range known {
		if d := distance(word, k); d < bestD || d == bestD && best != "" && k < best {
			best, bestD = k, d
		}
	}
	return best
}

// distance is the Levenshtein distance of two short strings.
func distance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
