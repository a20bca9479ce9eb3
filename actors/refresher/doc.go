// Package refresher will hold the actor that polls a group's worker_config
// rows every ConfigRefreshInterval and publishes the effective group config
// to the claimers (seed "Consumer Group Config").
//
// Nothing lives here yet: group config other than Start is not declared, so
// there is nothing to refresh, and no code pretends otherwise.
package refresher
