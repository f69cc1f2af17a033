package algo

// What the external tests (package algo_test) read of the memory store's
// insides.

// HashedTagLen is hashedTagLen.
const HashedTagLen = hashedTagLen

// ShardCounts returns, per shard, the items of its expiry heap and the
// states it holds.
func (m *Memory) ShardCounts() (heap, states []int) {
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		heap = append(heap, len(sh.exp))
		states = append(states, len(sh.m)+len(sh.logs))
		sh.mu.Unlock()
	}
	return heap, states
}

// Registered returns how many identities and policies the store's
// registry holds.
func (m *Memory) Registered() (ids, policies int) {
	m.regMu.RLock()
	defer m.regMu.RUnlock()
	return len(m.ids), len(m.policies)
}
