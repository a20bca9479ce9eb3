package sqlstreams

import "context"

// declareMode is how registering a group declares its config document.
type declareMode int

const (
	// declareAlways stores the document every time (Register: newest wins).
	declareAlways declareMode = iota
	// declareAtCreation stores it only when the call creates the group
	// (Attach: an operator manages the config).
	declareAtCreation
	// declareSeed stores each worker's document only over an empty one
	// (the library's own alert groups).
	declareSeed
)

// Attach returns the consumer of a group whose config is managed outside
// the application — by an operator's `sqlstreams groups declare`, or
// Group.Declare — and consumes with whatever config is stored. It is
// Register, except for the config document: initial is declared only when
// this call creates the group (its cursor placed by initial.Start), and an
// existing group's stored config is kept as it is, so that a restart or a
// deploy of the application never reverts the operator's declaration (a
// Register with nil would declare the empty document). Running instances
// read the stored config as they always do, at every refresh.
//
// The binding set is the application's, as with Register:
// initial.Bindings is declared on every call (and waits, as Register's
// does, while live instances hold another set); an operator cannot change
// it. nil means an initial empty document and the whole stream. Decision
// 0072.
func (h *ConsumerHandle[T]) Attach(ctx context.Context, initial *ConsumerConfig) (*Consumer[T], error) {
	return h.register(ctx, initial, declareAtCreation)
}
