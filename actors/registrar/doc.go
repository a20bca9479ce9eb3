// Package registrar will hold the binding-declaration actor: install, join,
// wait (retried every BindingRetryInterval, forever) and swap of a group's
// binding set, per decision 0511 in the shared seeds.
//
// Nothing lives here yet. Until it does, a group has no bindings and receives
// the whole stream; no code pretends otherwise.
package registrar
