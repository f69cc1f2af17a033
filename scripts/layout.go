package scripts

// The numbers of the scripts' wire: what Go writes into decide.lua's and
// refund.lua's arguments and reads from their replies. Each script names
// them in a block of its own ("wire names", at its top), and
// TestWireNamesAgree holds every name there to the value here. Lua has no
// constants, and a local costs Redis an instruction each time the script
// runs, or an upvalue in every closure that reads it: Decide and Refund
// are the scripts with each name replaced by its value and the block
// removed (see inline), so that a name costs Redis nothing.

// The algorithms' ids: algo.Algorithm's values.
const (
	FixedWindow          = 1
	SlidingWindowLog     = 2
	SlidingWindowCounter = 3
	TokenBucket          = 4
	LeakyBucket          = 5
	GCRA                 = 6
)

// The reasons of a rule's answer: algo.Reason's values.
const (
	ReasonNone        = 0
	ReasonLimited     = 1
	ReasonCostTooHigh = 2
)

// The layouts of decide.lua's argument, told apart by its first byte: an
// algorithm's id starts the one-rule layout, FlatLayout the flat layout,
// BatchLayout (three zero bytes) a batch.
const (
	BatchLayout = 0
	FlatLayout  = 7
)

// The first bytes of decide.lua's reply that are no batch's: a request of
// one rule admitted with no delay ([B] LeanReply, [d] remaining, [d] reset
// after), and a flat layout's request every rule of which admitted with no
// delay ([B] FlatReply, then per rule [d] remaining, [d] reset after). A
// batch's reply starts with a request's admitted byte, 0 or 1.
const (
	LeanReply = 2
	FlatReply = 3
)

// The flags of a rule in the one-rule layout, and a rule's shadow byte in
// the other layouts (FlagShadow alone).
const (
	FlagShadow     = 1 // the rule's denial does not deny
	FlagPinnedTime = 2 // the time follows (tests only)
)

// The flags of a batch's header.
const (
	FlagRefundTokens = 1 // reply with a refund token per rule
	FlagSlots        = 2 // a Redis Cluster batch of several slots
)

// The values a script unpacks per rule of the flat layout ([BBdddddd]:
// algorithm, shadow, limit, window, burst, delay, max cost, cost) and per
// policy of a batch ([Bddddd]: algorithm, limit, window, burst, delay, max
// cost).
const (
	FlatRuleValues = 8
	PolicyValues   = 6
)

// EpochMicros is the origin of the stores' clocks, 2020-01-01T00:00:00Z,
// in Unix microseconds: times on the wire are microseconds since then.
// Keeping them small keeps every sum of a time and a duration an exact
// integer in a float64, and window indexes short in storage.
const EpochMicros = 1577836800_000000
