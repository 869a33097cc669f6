package signing

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Fuzz targets next to FuzzVerify and FuzzAppendJSString: the timestamp
// parser every signed request goes through, the v3 signer against the
// reference HMAC, and the async canonical string a backend rebuilds.

// FuzzParseTimestamp: only plain decimal digits parse; seconds round-trip
// through Timestamp; nothing panics or overflows into a wrong time.
func FuzzParseTimestamp(f *testing.F) {
	for _, s := range []string{
		"1718000000", "1718000000000", "0", "", "-1", "+1", " 1", "1.5", "1e9",
		"9223372036854775807", "9223372036854775808", "99999999999999999999",
		"0001718000000", "١٢٣", "0x10", "1718000000\n",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ts, err := ParseTimestamp(s)
		digits := s != "" && strings.Trim(s, "0123456789") == ""
		if err != nil {
			n, perr := strconv.ParseInt(s, 10, 64)
			if digits && perr == nil {
				t.Fatalf("%q (%d) refused: %v", s, n, err)
			}
			return
		}
		if !digits {
			t.Fatalf("%q accepted as %v", s, ts)
		}
		n, _ := strconv.ParseInt(s, 10, 64)
		if len(s) >= millisDigits {
			if ts.UnixMilli() != n {
				t.Fatalf("%q read as %d ms", s, ts.UnixMilli())
			}
			return
		}
		if ts.Unix() != n || Timestamp(ts) != strconv.FormatInt(n, 10) {
			t.Fatalf("%q read as %d s", s, ts.Unix())
		}
		// Within must be consistent with the parsed time.
		if !Within(ts, ts, ts, 0) || Within(ts, ts.Add(2*time.Second), ts.Add(3*time.Second), 0) {
			t.Fatalf("Within disagrees with %v", ts)
		}
	})
}

// FuzzSignV3: SignV3 is the reference HMAC of payload + timestamp + the
// context string for any input, Verify accepts it, and changing one byte of
// the payload or the user id makes it fail.
func FuzzSignV3(f *testing.F) {
	f.Add([]byte("whsec_1"), []byte(`{"prompt":"hi"}`), "1718000000", "sub-ext-id", "prod-uuid-1", "roleA,roleB", "ACTIVE")
	f.Add([]byte("k"), []byte{}, "0", "", "", "", "")
	f.Add([]byte("k"), []byte{0, 0xff}, "1718000000", "owner", "", "", "ACTIVE")
	f.Fuzz(func(t *testing.T, secret, payload []byte, ts, user, product, roles, status string) {
		uc := UserContext{UserID: user, ServiceProductID: product, SubscriptionStatus: status}
		if roles != "" {
			uc.Roles = strings.Split(roles, ",")
		}
		canonical := append(append(append([]byte{}, payload...), ts...), "3"+user+product+roles+status...)
		got := SignV3(secret, payload, ts, uc)
		if want := referenceHMAC(string(secret), canonical); got != want {
			t.Fatalf("SignV3 = %s, reference %s", got, want)
		}
		if len(secret) == 0 {
			return // an empty secret verifies nothing
		}
		if !Verify([][]byte{secret}, got, canonical) {
			t.Fatal("Verify refuses SignV3's signature")
		}
		if len(payload) > 0 {
			tampered := append([]byte{}, canonical...)
			tampered[0] ^= 1
			if Verify([][]byte{secret}, got, tampered) {
				t.Fatal("a tampered payload verifies")
			}
		}
		other := uc
		other.UserID += "x"
		if SignV3(secret, payload, ts, other) == got {
			t.Fatal("another user signs alike")
		}
	})
}

// FuzzAsyncCanonical: the canonical payload is a JSON object with exactly
// the keys payload and request_id, in that order, whose values decode to
// the strings a backend finds in the envelope.
func FuzzAsyncCanonical(f *testing.F) {
	f.Add(`{"q":"a<b & c>d"}`, "7f0c2a4e-1b9d-4c3e-8f6a-2d5b9e1c0a77")
	f.Add("\u2028\u2029\x00\x7f\"\\", "id")
	f.Add("\xff\xe2\x82", "")
	f.Fuzz(func(t *testing.T, payload, id string) {
		b := AsyncCanonical(payload, id)
		if !strings.HasPrefix(string(b), `{"payload":`) || !json.Valid(b) {
			t.Fatalf("not a JSON object: %q", b)
		}
		var m map[string]string
		if err := json.Unmarshal(b, &m); err != nil || len(m) != 2 {
			t.Fatalf("decode %q: %v %v", b, m, err)
		}
		if m["payload"] != string(whatwgDecode(payload)) || m["request_id"] != string(whatwgDecode(id)) {
			t.Fatalf("decodes to %q / %q", m["payload"], m["request_id"])
		}
		if i := strings.Index(string(b), `,"request_id":`); i < 0 || string(b[len(`{"payload":`):i]) != string(AppendJSString(nil, payload)) {
			t.Fatalf("payload not written by AppendJSString: %q", b)
		}
	})
}
