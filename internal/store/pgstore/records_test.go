package pgstore

import (
	"encoding/json"
	"math"
	"reflect"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// Rows as the earlier encoding wrote them: json.Marshal of store.KeyRecord,
// of store.Subscription (balance zeroed) and of a record embedding
// store.Job, through the store types' own tags. They are literals, not
// json.Marshal of the store types now, so that a tag changed on a store
// type later does not change what this test expects of rows already in
// databases.
const (
	oldKeyRow = `{"keyId":"key_1","userId":"alice","roles":["admin","x"],"label":"ci \u003c\u0026\u003e",` +
		`"createdAt":"2024-03-20T12:00:00.123456789Z","expiresAt":"2024-03-20T13:00:00.123456789Z",` +
		`"revokedAt":"2024-03-20T12:01:00.123456789Z","parentKeyId":"key_0","endsWithParent":true}`
	oldBareKeyRow = `{"keyId":"k2","userId":"bob","createdAt":"2024-03-20T12:00:00.123456789Z"}`
	oldSubRow     = `{"userId":"alice","serviceId":"svc","productId":"p","status":"ACTIVE",` +
		`"startedAt":"2024-03-20T12:00:00.123456789Z","updatedAt":"2024-03-20T12:00:01.123456789Z","credits":0,"creditsHeld":0}`
	endingSubRow = `{"userId":"alice","serviceId":"svc","productId":"p","status":"CANCELLING",` +
		`"startedAt":"2024-03-20T12:00:00.123456789Z","updatedAt":"2024-03-20T12:00:01.123456789Z","credits":0,"creditsHeld":0,` +
		`"endsAt":"2024-04-20T12:00:00Z","endStatus":"CANCELLED"}`
	oldJobRow = `{"requestId":"req-1","userId":"alice","keyId":"key_1","serviceId":"svc","endpointId":"ep","productId":"p",` +
		`"free":true,"status":"COMPLETED","currentStage":"done","percentageComplete":99.5,"errorMessage":"none",` +
		`"startTime":"2024-03-20T12:00:00.123456789Z","updatedAt":"2024-03-20T12:00:01.123456789Z",` +
		`"expiresAt":"2024-03-20T13:00:00.123456789Z","completedAt":"2024-03-20T12:00:02.123456789Z",` +
		`"result":"{\"a\":1}","size":7,"resultTruncated":true,"resultUrl":"https://x/y","contentType":"application/json",` +
		`"units":1.5,"cost":-9223372036854.775808,"completionDigest":"abc","reservationId":"job/req-1",` +
		`"holdKey":{"UserID":"alice","ServiceID":"svc","Period":1710000000}}`
	oldBareJobRow = `{"requestId":"req-2","userId":"bob","serviceId":"svc","endpointId":"ep","status":"PENDING",` +
		`"percentageComplete":0,"startTime":"2024-03-20T12:00:00.123456789Z","updatedAt":"2024-03-20T12:00:00.123456789Z",` +
		`"expiresAt":"2024-03-20T13:00:00.123456789Z"}`
)

var recT0 = time.Date(2024, 3, 20, 12, 0, 0, 123456789, time.UTC)

// TestRecordsReadOldRows reads rows the earlier encoding wrote through the
// store's own record types, every field set and almost none, and checks
// that writing the same values again gives the same JSON: rows keep one
// shape whichever version wrote them.
func TestRecordsReadOldRows(t *testing.T) {
	t.Run("key", func(t *testing.T) {
		want := store.KeyRecord{ID: "key_1", UserID: "alice", Roles: []string{"admin", "x"}, Label: "ci <&>",
			Created: recT0, ExpiresAt: recT0.Add(time.Hour), RevokedAt: recT0.Add(time.Minute),
			ParentKeyID: "key_0", EndsWithParent: true}
		checkAllSet(t, want, "Hash")
		roundTrip(t, oldKeyRow, want, func(r keyRecord) store.KeyRecord { return r.key() }, toKeyRecord)
		roundTrip(t, oldBareKeyRow, store.KeyRecord{ID: "k2", UserID: "bob", Created: recT0},
			func(r keyRecord) store.KeyRecord { return r.key() }, toKeyRecord)
	})
	t.Run("subscription", func(t *testing.T) {
		// The balance comes from its columns, whatever rec says.
		want := store.Subscription{UserID: "alice", ServiceID: "svc", ProductID: "p", Status: "ACTIVE",
			StartedAt: recT0, UpdatedAt: recT0.Add(time.Second), Credits: billing.Whole(5), CreditsHeld: 1}
		// A row written before subscriptions could end reads as one that
		// does not end, and one that ends keeps its end.
		roundTrip(t, oldSubRow, want,
			func(r subRecord) store.Subscription { return r.subscription(billing.Whole(5), 1) }, toSubRecord)
		ending := want
		ending.Status, ending.EndsAt, ending.EndStatus = "CANCELLING", time.Date(2024, 4, 20, 12, 0, 0, 0, time.UTC), "CANCELLED"
		roundTrip(t, endingSubRow, ending,
			func(r subRecord) store.Subscription { return r.subscription(billing.Whole(5), 1) }, toSubRecord)
		// A row written since revisions were kept (PutSubscriptionIf)
		// keeps its revision; the rows before read as revision 0.
		revised := ending
		revised.Revision = 3
		// RestartPeriodsAt is an instruction to PutSubscription, never
		// stored.
		checkAllSet(t, revised, "RestartPeriodsAt")
		roundTrip(t, endingSubRow[:len(endingSubRow)-1]+`,"rev":3}`, revised,
			func(r subRecord) store.Subscription { return r.subscription(billing.Whole(5), 1) }, toSubRecord)
	})
	t.Run("job", func(t *testing.T) {
		hold := &AllowanceKey{UserID: "alice", ServiceID: "svc", Period: 1710000000}
		want := store.Job{ID: "req-1", UserID: "alice", KeyID: "key_1", ServiceID: "svc", EndpointID: "ep", ProductID: "p",
			Free: true, Status: "COMPLETED", Stage: "done", PercentageComplete: 99.5, ErrorMessage: "none",
			CreatedAt: recT0, UpdatedAt: recT0.Add(time.Second), ExpiresAt: recT0.Add(time.Hour),
			CompletedAt: recT0.Add(2 * time.Second), Result: `{"a":1}`, ResultSize: 7, ResultTruncated: true,
			ResultURL: "https://x/y", ContentType: "application/json", Units: 1_500_000, Cost: math.MinInt64,
			CompletionDigest: "abc", ReservationID: "job/req-1"}
		// A row from before jobs kept their terms has none.
		checkAllSet(t, want, "Terms")
		readJob := func(r jobRecord) store.Job {
			if r.HoldKey == nil || *r.HoldKey != *hold {
				t.Errorf("holdKey = %+v, want %+v", r.HoldKey, hold)
			}
			return r.job()
		}
		roundTrip(t, oldJobRow, want, readJob, func(j store.Job) jobRecord { return toJobRecord(j, hold) })
		// A row with them: the product's own JSON and the endpoint's cost,
		// after every field the earlier rows had.
		p := billing.Product{ID: "p", BillingModel: billing.Prepaid, MeasurementType: billing.PerRequest, UnitLabel: "call", Price: billing.Whole(2)}
		pj, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		want.Terms = &store.JobTerms{Product: &p, EndpointCost: 1_500_000}
		checkAllSet(t, want)
		roundTrip(t, oldJobRow[:len(oldJobRow)-1]+`,"terms":{"product":`+string(pj)+`,"endpointCost":1.5}}`, want,
			readJob, func(j store.Job) jobRecord { return toJobRecord(j, hold) })
		roundTrip(t, oldBareJobRow, store.Job{ID: "req-2", UserID: "bob", ServiceID: "svc", EndpointID: "ep",
			Status: "PENDING", CreatedAt: recT0, UpdatedAt: recT0, ExpiresAt: recT0.Add(time.Hour)},
			func(r jobRecord) store.Job { return r.job() }, func(j store.Job) jobRecord { return toJobRecord(j, nil) })
	})
}

// roundTrip reads row through the record type R into a store value, which
// must be want, and writes want back, which must give row again.
func roundTrip[R, V any](t *testing.T, row string, want V, read func(R) V, write func(V) R) {
	t.Helper()
	var r R
	if err := json.Unmarshal([]byte(row), &r); err != nil {
		t.Fatalf("reading %s: %v", row, err)
	}
	if got := read(r); !reflect.DeepEqual(got, want) {
		t.Errorf("read back\n %+v\nwant\n %+v", got, want)
	}
	again, err := json.Marshal(write(want))
	if err != nil {
		t.Fatal(err)
	}
	if string(again) != row {
		t.Errorf("written again as\n %s\nwant\n %s", again, row)
	}
}

// checkAllSet fails when a field of v (but those named) is zero: the test
// value must set every field, so that a field added to the store type and
// not to the record is caught by the round trip.
func checkAllSet(t *testing.T, v any, except ...string) {
	t.Helper()
	rv := reflect.ValueOf(v)
next:
	for i := range rv.NumField() {
		name := rv.Type().Field(i).Name
		for _, e := range except {
			if name == e {
				continue next
			}
		}
		if rv.Field(i).IsZero() {
			t.Errorf("%s.%s is not set in the test value: set it, and store it in the record type",
				rv.Type().Name(), name)
		}
	}
}
