package guard

import "sort"

// Circuit is one store shard's circuit, as a status page shows it.
type Circuit struct {
	// Shard numbers the shard as the store does (one shard: 0); -1 is
	// the circuit that stands for every shard while the store was not
	// ready at start.
	Shard int `json:"shard"`
	// State is closed (the store decides) or open (the fail mode does).
	State string `json:"state"`
}

// Circuits returns the state of every circuit the guard has, by shard;
// none for a store that never fails (the memory store).
func (g *Guard) Circuits() []Circuit {
	if !g.remote {
		return nil
	}
	bs := g.breakers
	bs.mu.RLock()
	defer bs.mu.RUnlock()
	var out []Circuit
	if s := state(bs.global.state.Load()); s != stateClosed {
		out = append(out, Circuit{Shard: globalShard, State: s.String()})
	}
	for shard, b := range bs.m {
		out = append(out, Circuit{Shard: shard, State: state(b.state.Load()).String()})
	}
	if len(out) == 0 {
		out = append(out, Circuit{Shard: 0, State: stateClosed.String()})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Shard < out[j].Shard })
	return out
}
