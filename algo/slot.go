package algo

// bySlot groups the indexes of reqs by the Redis Cluster hash slot of their
// keys, in order of first appearance. Every key of a request shares its
// slot: the slot of its hash tag.
func bySlot(reqs []Request) [][]int {
	var slots []uint16
	var groups [][]int
	for i, q := range reqs {
		s := slot(keyTag(q.Key))
		g := 0
		for g < len(slots) && slots[g] != s {
			g++
		}
		if g == len(slots) {
			slots = append(slots, s)
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], i)
	}
	return groups
}

// slot is Redis Cluster's hash slot of a hash tag: CRC16 (XMODEM) mod 16384.
func slot(tag string) uint16 {
	var crc uint16
	for i := 0; i < len(tag); i++ {
		crc ^= uint16(tag[i]) << 8
		for b := 0; b < 8; b++ {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc & 16383
}
