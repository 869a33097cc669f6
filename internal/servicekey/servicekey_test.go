package servicekey

import (
	"crypto/sha256"
	"encoding/hex"
	"hash/crc32"
	"math/big"
	"regexp"
	"strings"
	"testing"
)

// keyPattern is the expression a secret scanner would use; every generated
// key must match it.
var keyPattern = regexp.MustCompile(`^psk_[0-9A-Za-z]{39}$`)

// A fixed key built by hand: 33 random characters and the checksum worked
// out with math/big rather than putChecksum.
var (
	fixedRandom = "abcdefghijklmnopqrstuvwxyz0123456"
	fixedKey    = "psk_" + fixedRandom + checksumOf(fixedRandom)
)

func checksumOf(random string) string {
	s := big.NewInt(int64(crc32.ChecksumIEEE([]byte(random)))).Text(62)
	// big.Int.Text uses 0-9a-zA-Z; our alphabet is 0-9A-Za-z.
	s = strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z':
			return r - 'a' + 'A'
		case r >= 'A' && r <= 'Z':
			return r - 'A' + 'a'
		}
		return r
	}, s)
	return strings.Repeat("0", 6-len(s)) + s
}

func TestGenerate(t *testing.T) {
	const n = 10000
	seen := make(map[string]bool, n)
	for i := 0; i < n; i++ {
		key, hash, err := Generate()
		if err != nil {
			t.Fatal(err)
		}
		if !keyPattern.MatchString(key) {
			t.Fatalf("key %q does not match %v", key, keyPattern)
		}
		if !WellFormed(key) {
			t.Fatalf("generated key %q is not well formed", key)
		}
		if want := checksumOf(key[4:37]); key[37:] != want {
			t.Fatalf("key %q checksum %s, want %s", key, key[37:], want)
		}
		if hash != sha256.Sum256([]byte(key)) || hash != Hash(key) {
			t.Fatalf("hash of %q does not match Hash", key)
		}
		if seen[key] {
			t.Fatalf("duplicate key after %d", i)
		}
		seen[key] = true
	}
}

// TestGenerateUniform checks that rejection sampling leaves no visible bias:
// with modulo reduction the first 8 characters would come up 5/4 as often.
func TestGenerateUniform(t *testing.T) {
	var counts [62]int
	total := 0
	for i := 0; i < 3000; i++ {
		key, _, err := Generate()
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range key[4:37] {
			counts[strings.IndexRune(alphabet, c)]++
			total++
		}
	}
	mean := float64(total) / 62 // about 1597
	for i, c := range counts {
		// ±20% is more than 8 standard deviations, so this never flakes,
		// and well under the 25% excess that modulo bias would give.
		if float64(c) < 0.8*mean || float64(c) > 1.2*mean {
			t.Errorf("character %q drawn %d times, mean %.0f", alphabet[i], c, mean)
		}
	}
}

func TestHash(t *testing.T) {
	tests := []struct{ key, want string }{
		// sha256sum of the literal string, computed outside Go.
		{"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
		{"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
	}
	for _, tt := range tests {
		got := Hash(tt.key)
		if hex.EncodeToString(got[:]) != tt.want {
			t.Errorf("Hash(%q) = %x, want %s", tt.key, got, tt.want)
		}
	}
	for _, key := range []string{fixedKey, strings.Repeat("x", 64), strings.Repeat("y", 65), strings.Repeat("z", 1000)} {
		if Hash(key) != sha256.Sum256([]byte(key)) {
			t.Errorf("Hash of a %d-byte key is not its SHA-256", len(key))
		}
		if first, again := Hash(key), Hash(key); first != again {
			t.Errorf("Hash of a %d-byte key is not stable", len(key))
		}
	}
	if Hash(fixedKey) == Hash(fixedKey[:42]+"X") {
		t.Error("different keys hash the same")
	}
}

func TestWellFormed(t *testing.T) {
	if len(fixedKey) != 43 {
		t.Fatalf("fixed key %q has length %d", fixedKey, len(fixedKey))
	}
	tests := []struct {
		name string
		key  string
		want bool
	}{
		{"hand-built key", fixedKey, true},
		{"all zeros with its checksum", "psk_" + strings.Repeat("0", 33) + checksumOf(strings.Repeat("0", 33)), true},
		{"empty", "", false},
		{"prefix only", "psk_", false},
		{"wrong prefix", "ghp_" + fixedKey[4:], false},
		{"upper-case prefix", "PSK_" + fixedKey[4:], false},
		{"dash for underscore", "psk-" + fixedKey[4:], false},
		{"no separator, one char longer random", "psk" + fixedKey[4:] + "a", false},
		{"one character short", fixedKey[:42], false},
		{"one character long", fixedKey + "0", false},
		{"Bearer left on", "Bearer " + fixedKey, false},
		{"trailing newline", fixedKey[:42] + "\n", false},
		{"trailing space", fixedKey + " ", false},
		{"underscore in random", fixedKey[:10] + "_" + fixedKey[11:], false},
		{"dash in random", fixedKey[:10] + "-" + fixedKey[11:], false},
		{"NUL in random", fixedKey[:10] + "\x00" + fixedKey[11:], false},
		{"non-ASCII in random", fixedKey[:10] + "\xc3" + fixedKey[11:], false},
		{"bad character in checksum", fixedKey[:42] + "+", false},
		{"random and checksum swapped", "psk_" + fixedKey[37:] + fixedKey[4:37], false},
		{"checksum of a different random", "psk_" + strings.Repeat("0", 33) + checksumOf(fixedRandom), false},
		{"checksum above 2^32", "psk_" + fixedRandom + "zzzzzz", false},
		{"key id is not a key", NewID() + strings.Repeat("0", 19), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := WellFormed(tt.key); got != tt.want {
				t.Errorf("WellFormed(%q) = %v, want %v", tt.key, got, tt.want)
			}
		})
	}
}

// TestWellFormedSingleChange flips every character after the prefix to
// every other base62 character: CRC32 catches every single-character
// change in the random part, and a changed checksum digit changes its value.
func TestWellFormedSingleChange(t *testing.T) {
	keys := []string{fixedKey}
	for i := 0; i < 5; i++ {
		k, _, err := Generate()
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k)
	}
	for _, key := range keys {
		for i := len(Prefix) + 1; i < len(key); i++ {
			for j := 0; j < len(alphabet); j++ {
				if alphabet[j] == key[i] {
					continue
				}
				changed := key[:i] + alphabet[j:j+1] + key[i+1:]
				if WellFormed(changed) {
					t.Fatalf("WellFormed(%q) = true after changing position %d of %q", changed, i, key)
				}
			}
		}
	}
}

func TestWellFormedAllocs(t *testing.T) {
	allocs := testing.AllocsPerRun(100, func() {
		WellFormed(fixedKey)
		WellFormed("psk_" + "x")
	})
	if allocs != 0 {
		t.Errorf("WellFormed allocated %v times", allocs)
	}
}

func TestNewID(t *testing.T) {
	idPattern := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	seen := make(map[string]bool)
	prev := ""
	for i := 0; i < 10000; i++ {
		id := NewID()
		if !idPattern.MatchString(id) {
			t.Fatalf("id %q does not match %v", id, idPattern)
		}
		if WellFormed(id) || !IsID(id) || CanonicalID(id) != id {
			t.Fatalf("id %q: WellFormed %v, IsID %v, CanonicalID %q", id, WellFormed(id), IsID(id), CanonicalID(id))
		}
		if seen[id] {
			t.Fatalf("duplicate id after %d", i)
		}
		// Version 7 ids sort in creation order, so listings do.
		if id <= prev {
			t.Fatalf("id %q sorts before the previous %q", id, prev)
		}
		seen[id], prev = true, id
	}
}

func TestIsID(t *testing.T) {
	key, _, err := Generate()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		id   string
		want bool
	}{
		{"6ba7b810-9dad-11d1-80b4-00c04fd430c8", true},
		{"6BA7B810-9DAD-11D1-80B4-00C04FD430C8", true},
		{"key_AbCdEfGhIjKlMnOpQrSt", true}, // issued before ids were UUIDs
		{"key_x", true},
		{"key_", false},
		{"key_not/an id", false},
		{"key_" + strings.Repeat("a", 61), false},
		{"6ba7b810-9dad-11d1-80b4-00c04fd430cz", false},
		{"{6ba7b810-9dad-11d1-80b4-00c04fd430c8}", false},
		{"6ba7b8109dad11d180b400c04fd430c8", false},
		{key, false},
		{"", false},
	}
	for _, tt := range tests {
		if got := IsID(tt.id); got != tt.want {
			t.Errorf("IsID(%q) = %v, want %v", tt.id, got, tt.want)
		}
	}
	for in, want := range map[string]string{
		"6BA7B810-9DAD-11D1-80B4-00C04FD430C8": "6ba7b810-9dad-11d1-80b4-00c04fd430c8",
		"key_AbCdEfGhIjKlMnOpQrSt":             "key_AbCdEfGhIjKlMnOpQrSt",
		"whatever":                             "whatever",
	} {
		if got := CanonicalID(in); got != want {
			t.Errorf("CanonicalID(%q) = %q, want %q", in, got, want)
		}
	}
}

func FuzzWellFormed(f *testing.F) {
	f.Add(fixedKey)
	f.Add("")
	f.Add("psk_")
	f.Add(fixedKey[:42] + "\xff")
	f.Fuzz(func(t *testing.T, key string) {
		got := WellFormed(key)
		want := keyPattern.MatchString(key) && checksumOf(key[4:37]) == key[37:]
		if got != want {
			t.Fatalf("WellFormed(%q) = %v, want %v", key, got, want)
		}
	})
}

func BenchmarkWellFormedHash(b *testing.B) {
	key, _, err := Generate()
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if !WellFormed(key) {
			b.Fatal("not well formed")
		}
		_ = Hash(key)
	}
}

func BenchmarkGenerate(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := Generate(); err != nil {
			b.Fatal(err)
		}
	}
}
