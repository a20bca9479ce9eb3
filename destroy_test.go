package sqlstreams

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/c1702965/sqlstreams/internal/store/storetest"
	"github.com/stretchr/testify/require"
)

// destroyFixture: streams orders (groups g, with a dead letter and a
// delivery log, and audit; a schedule) and refunds (group payouts).
func destroyFixture(t *testing.T, allow bool) (*env, *stepper, *StreamHandle[order]) {
	t.Helper()
	st, s := newStepper(t, &ConsumerConfig{DeliveryLog: DeliveryLogAll}, func(o *order, _ int) error {
		if o.OrderID == "bad" {
			return Terminal(errors.New("no"))
		}
		return nil
	})
	e := st.e
	e.client.cfg.AllowDestroy = allow
	ctx := context.Background()
	_, err := s.Produce(ctx, order{OrderID: "ok"}, nil)
	require.NoError(t, err)
	_, err = s.Produce(ctx, order{OrderID: "bad"}, nil)
	require.NoError(t, err)
	st.claimRange()
	_, err = s.Consumer("audit").Register(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, e.client.Scheduler("nightly").Register(ctx, "orders", "0 3 * * *", order{OrderID: "n"}, nil))
	refunds := e.stream("refunds")
	_, err = refunds.Consumer("payouts").Register(ctx, nil)
	require.NoError(t, err)
	e.produceN(refunds, "r", 3)
	return e, st, refunds
}

func TestDestroyIsRefusedUnlessAllowed(t *testing.T) {
	e, st, _ := destroyFixture(t, false)
	ctx := context.Background()
	_, err := e.client.DestroyStream(ctx, "orders", nil)
	require.ErrorIs(t, err, ErrDestroyNotAllowed)
	_, err = e.client.DestroyGroup(ctx, "orders", "g", nil)
	require.ErrorIs(t, err, ErrDestroyNotAllowed)
	rels, err := storetest.StreamRelations(ctx, e.client.store, st.c.group.StreamID)
	require.NoError(t, err)
	require.NotEmpty(t, rels)

	// A dry run is allowed, and changes nothing.
	dry, err := e.client.DestroyStream(ctx, "orders", &DestroyOptions{DryRun: true})
	require.NoError(t, err)
	require.Equal(t, []string{"audit", "g"}, dry.Groups)
	require.EqualValues(t, 2, dry.Rows["log"])
	require.Contains(t, dry.Relations, fmt.Sprintf("stream_%d_log", st.c.group.StreamID))
	after, err := storetest.StreamRelations(ctx, e.client.store, st.c.group.StreamID)
	require.NoError(t, err)
	require.Equal(t, rels, after)
	gd, err := e.client.DestroyGroup(ctx, "orders", "g", &DestroyOptions{DryRun: true})
	require.NoError(t, err)
	require.EqualValues(t, 1, gd.Rows["exception"], "the dead letter")
	require.EqualValues(t, 2, gd.Rows["delivery"])
	require.Equal(t, 3, e.groupCount(), "nothing removed")
}

func TestDestroyStreamRemovesEverythingItOwnsAndNothingElse(t *testing.T) {
	e, st, refunds := destroyFixture(t, true)
	ctx := context.Background()
	id := st.c.group.StreamID
	res, err := e.client.DestroyStream(ctx, "orders", nil)
	require.NoError(t, err)
	require.Equal(t, []string{"audit", "g"}, res.Groups)

	rels, err := storetest.StreamRelations(ctx, e.client.store, id)
	require.NoError(t, err)
	require.Empty(t, rels, "tables, partitions, indexes and sequences of the stream are gone")
	rows, err := storetest.SharedRows(ctx, e.client.store, id)
	require.NoError(t, err)
	for table, n := range rows {
		require.Zero(t, n, "%s still holds the stream's rows", table)
	}
	_, err = e.client.Group(ctx, "orders", "g")
	require.ErrorIs(t, err, ErrNotRegistered)

	// The other stream is untouched and works.
	require.EqualValues(t, 3, e.count(refunds))
	g, err := e.client.Group(ctx, "refunds", "payouts")
	require.NoError(t, err)
	s, err := g.Status(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 3, s.Lag)
	_, err = refunds.Produce(ctx, order{OrderID: "r-more"}, nil)
	require.NoError(t, err)

	// The name can be registered again: a new, empty stream.
	again := e.stream("orders")
	require.Zero(t, e.count(again))
}

func TestDestroyGroupRemovesOnlyItsRows(t *testing.T) {
	e, st, _ := destroyFixture(t, true)
	ctx := context.Background()
	audit, err := e.client.Group(ctx, "orders", "audit")
	require.NoError(t, err)
	auditBefore, err := storetest.GroupRows(ctx, e.client.store, st.c.group.StreamID, audit.row.ID)
	require.NoError(t, err)

	res, err := e.client.DestroyGroup(ctx, "orders", "g", nil)
	require.NoError(t, err)
	require.EqualValues(t, 1, res.Rows["exception"])
	rows, err := storetest.GroupRows(ctx, e.client.store, st.c.group.StreamID, st.c.group.ID)
	require.NoError(t, err)
	for table, n := range rows {
		require.Zero(t, n, "%s still holds the group's rows", table)
	}
	auditAfter, err := storetest.GroupRows(ctx, e.client.store, st.c.group.StreamID, audit.row.ID)
	require.NoError(t, err)
	require.Equal(t, auditBefore, auditAfter, "the other group is untouched")
	require.EqualValues(t, 2, e.count(st.c.s), "the stream's messages stay")
	_, err = e.client.Group(ctx, "orders", "g")
	require.ErrorIs(t, err, ErrNotRegistered)
	_, err = e.client.DestroyGroup(ctx, "orders", "g", nil)
	require.ErrorIs(t, err, ErrNotRegistered)
}

func TestDestroyIsRefusedWhileAnInstanceIsLive(t *testing.T) {
	e, st, _ := destroyFixture(t, true)
	ctx := context.Background()
	e.incumbent(t, st.c, st.mock, nil)
	_, err := e.client.DestroyStream(ctx, "orders", nil)
	require.ErrorIs(t, err, ErrGroupActive)
	_, err = e.client.DestroyGroup(ctx, "orders", "g", nil)
	require.ErrorIs(t, err, ErrGroupActive)
	_, err = e.client.DestroyGroup(ctx, "orders", "audit", nil)
	require.NoError(t, err, "another group of the stream has no live instance")
}

func TestDestroyFromTheHandles(t *testing.T) {
	e, st, refunds := destroyFixture(t, true)
	ctx := context.Background()
	res, err := st.c.Destroy(ctx, &DestroyOptions{DryRun: true})
	require.NoError(t, err)
	require.True(t, res.DryRun)
	_, err = st.c.Destroy(ctx, nil)
	require.NoError(t, err)
	_, err = e.client.Group(ctx, "orders", "g")
	require.ErrorIs(t, err, ErrNotRegistered)

	row, _, err := refunds.resolve(ctx, nil)
	require.NoError(t, err)
	_, err = refunds.Destroy(ctx, nil)
	require.NoError(t, err)
	rels, err := storetest.StreamRelations(ctx, e.client.store, row.ID)
	require.NoError(t, err)
	require.Empty(t, rels)
	_, err = refunds.Produce(ctx, order{OrderID: "late"}, nil)
	require.ErrorIs(t, err, ErrNotRegistered, "the stream is gone; its handle says so")
	require.NoError(t, refunds.Register(ctx, nil), "and the name can be registered again")
}
