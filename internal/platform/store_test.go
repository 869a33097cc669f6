package platform

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	bolt "go.etcd.io/bbolt"

	"github.com/platformgw/gateway/internal/servicekey"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/boltstore"
)

// TestHelperCaddy is not a test: run by caddyProcess with
// PLATFORM_TEST_CADDY set, it is `caddy` with the arguments after "--",
// the way the built binary is (caddycmd.Main with this package's modules).
func TestHelperCaddy(t *testing.T) {
	if os.Getenv("PLATFORM_TEST_CADDY") != "1" {
		t.Skip("runs only as a subprocess of the store tests")
	}
	args := os.Args
	for i, a := range args {
		if a == "--" {
			args = args[i+1:]
			break
		}
	}
	os.Args = append([]string{"caddy"}, args...)
	caddycmd.Main()
}

// caddyProcess runs `caddy args...` in a process of its own (this test
// binary as caddy) and returns its combined output and error; it is
// killed after a minute, so a server that starts when it should not
// does not hang the test.
func caddyProcess(t *testing.T, env []string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, self, append([]string{"-test.run=^TestHelperCaddy$", "--"}, args...)...)
	cmd.Env = append(append(os.Environ(), "PLATFORM_TEST_CADDY=1"), env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// fillStore writes a real store of a few hundred pages at path (keys of
// many users, through boltstore) and returns one of its keys' ids.
func fillStore(t *testing.T, path string) string {
	t.Helper()
	s, err := boltstore.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Go(func() {
			for i := range 60 {
				_, hash, _ := servicekey.Generate()
				err := s.CreateKey(context.Background(), store.KeyRecord{ID: fmt.Sprintf("key_%02d_%03d", w, i), Hash: hash,
					UserID: fmt.Sprintf("user-%03d", i), Label: strings.Repeat("a label ", 30), Created: time.Now().UTC()})
				if err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return "key_00_000"
}

// storeDamages are the ways an attack run broke copies of a real store,
// and two files that were never a platform store.
var storeDamages = []struct {
	name  string
	apply func(t *testing.T, path string)
	want  string
}{
	{"truncated to half", func(t *testing.T, path string) {
		st, _ := os.Stat(path)
		if err := os.Truncate(path, st.Size()/2); err != nil {
			t.Fatal(err)
		}
	}, "cut short"},
	{"64 random pages overwritten", func(t *testing.T, path string) {
		rep, err := boltstore.CheckFile(path)
		if err != nil {
			t.Fatal(err)
		}
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		r := rand.New(rand.NewPCG(7, 7))
		page := make([]byte, rep.PageSize)
		for range 64 {
			for i := range page {
				page[i] = byte(r.Uint32())
			}
			if _, err := f.WriteAt(page, (2+r.Int64N(int64(rep.HighWater)-2))*int64(rep.PageSize)); err != nil {
				t.Fatal(err)
			}
		}
	}, "store file is damaged"}, // which page bbolt meets first varies
	{"zero bytes", func(t *testing.T, path string) {
		if err := os.Truncate(path, 0); err != nil {
			t.Fatal(err)
		}
	}, "the file is empty"},
	{"not a bbolt file", func(t *testing.T, path string) {
		if err := os.WriteFile(path, bytes.Repeat([]byte("not a database\n"), 5000), 0o600); err != nil {
			t.Fatal(err)
		}
	}, "not a bbolt file"},
	{"another application's bbolt file", func(t *testing.T, path string) {
		os.Remove(path)
		db, err := bolt.Open(path, 0o600, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		err = db.Update(func(tx *bolt.Tx) error {
			b, err := tx.CreateBucket([]byte("sessions"))
			if err != nil {
				return err
			}
			return b.Put([]byte("s1"), []byte("{}"))
		})
		if err != nil {
			t.Fatal(err)
		}
	}, "another application"},
}

// damagedCopies writes, for each damage, a copy of one real store broken
// that way, and returns their paths by damage name.
func damagedCopies(t *testing.T) map[string]string {
	t.Helper()
	good := filepath.Join(t.TempDir(), "good.db")
	fillStore(t, good)
	raw, err := os.ReadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	paths := map[string]string{}
	for _, d := range storeDamages {
		path := filepath.Join(t.TempDir(), "platform.db")
		if err := os.WriteFile(path, raw, 0o600); err != nil {
			t.Fatal(err)
		}
		d.apply(t, path)
		paths[d.name] = path
	}
	return paths
}

// TestStartRefusesDamagedStore starts the real caddy (a process of its
// own, `caddy run`) on each damaged store: it must exit with an error
// naming the file and what is wrong, never die of a signal or a panic,
// and leave the file as it was.
func TestStartRefusesDamagedStore(t *testing.T) {
	paths := damagedCopies(t)
	for _, d := range storeDamages {
		t.Run(d.name, func(t *testing.T) {
			path := paths[d.name]
			before, _ := os.ReadFile(path)
			cfg := filepath.Join(t.TempDir(), "caddy.json")
			storeJSON, _ := json.Marshal(path)
			os.WriteFile(cfg, []byte(`{"admin": {"disabled": true}, "apps": {"platform": {"store": `+string(storeJSON)+`}}}`), 0o600)
			out, err := caddyProcess(t, nil, "run", "--config", cfg)
			var exit *exec.ExitError
			if !errors.As(err, &exit) || !exit.Exited() || exit.ExitCode() == 0 {
				t.Fatalf("caddy run: %v (want a plain non-zero exit)\n%s", err, out)
			}
			for _, bad := range []string{"panic:", "SIGBUS", "SIGSEGV", "goroutine "} {
				if strings.Contains(out, bad) {
					t.Fatalf("caddy run output has %q:\n%s", bad, out)
				}
			}
			if !strings.Contains(out, path) || !strings.Contains(out, d.want) {
				t.Fatalf("caddy run output does not name %s and %q:\n%s", path, d.want, out)
			}
			if after, _ := os.ReadFile(path); !bytes.Equal(before, after) {
				t.Errorf("the refused file changed (%d bytes, was %d)", len(after), len(before))
			}
		})
	}
}

// TestLoadRefusesDamagedStore loads each damaged store into the running
// in-process server (what `caddy reload` and the first load do): refused
// with the file's name and fault, and the server keeps serving.
func TestLoadRefusesDamagedStore(t *testing.T) {
	paths := damagedCopies(t)
	admTester(t).InitServer(fmt.Sprintf(`{"admin": {"listen": %q}}`, admAddr), "json")
	env := &admEnv{t: t}
	for _, d := range storeDamages {
		t.Run(d.name, func(t *testing.T) {
			path := paths[d.name]
			cfg := env.config(filepath.Dir(path), "")
			status, body := admLoad(t, cfg)
			if status == http.StatusOK || !strings.Contains(body, path) || !strings.Contains(body, d.want) {
				t.Fatalf("load: %d %s; want a refusal naming %s and %q", status, body, path, d.want)
			}
			if _, err := http.Get("http://" + admAddr + "/config/"); err != nil {
				t.Fatalf("the admin endpoint is gone: %v", err)
			}
		})
	}
}

// TestReloadRefusesStoreChange: a reload that names another store file
// (a shell without PLATFORM_STORE, say) is refused, and the running
// config keeps serving its store.
func TestReloadRefusesStoreChange(t *testing.T) {
	env := admStart(t)
	oldPath := env.dbPath
	ctx := context.Background()
	if err := env.app.DataStore().CreateKey(ctx, store.KeyRecord{ID: "key_kept", UserID: "alice", Created: time.Now().UTC()}); err != nil {
		t.Fatal(err)
	}
	other := t.TempDir()
	status, body := admLoad(t, env.config(other, ""))
	if status == http.StatusOK || !strings.Contains(body, "never switches stores") || !strings.Contains(body, oldPath) {
		t.Fatalf("reload onto another store: %d %s; want a refusal naming the running store", status, body)
	}
	if _, err := os.Stat(filepath.Join(other, "platform.db")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the refused reload created its store file: %v", err)
	}
	app := admActiveApp(t)
	if app.StorePath() != oldPath {
		t.Fatalf("running store %s, want %s", app.StorePath(), oldPath)
	}
	if k, err := app.DataStore().KeyByID(ctx, "key_kept"); err != nil || k.UserID != "alice" {
		t.Fatalf("key after the refused reload: %+v, %v", k, err)
	}

	// The same store reloads as ever, sharing the open file.
	cfg := env.config(filepath.Dir(oldPath), "")
	if status, body := admLoad(t, cfg); status != http.StatusOK {
		t.Fatalf("reload onto the same store: %d %s", status, body)
	}
	if k, err := admActiveApp(t).DataStore().KeyByID(ctx, "key_kept"); err != nil || k.UserID != "alice" {
		t.Fatalf("key after a reload: %+v, %v", k, err)
	}
}

// TestRelativeStorePath: a relative store path is under Caddy's data
// directory of the server, whatever the working directory.
func TestRelativeStorePath(t *testing.T) {
	data := t.TempDir()
	t.Setenv("XDG_DATA_HOME", data)
	t.Chdir(t.TempDir())
	want := filepath.Join(data, "caddy", "stores", "platform.db")
	for _, p := range []string{"stores/platform.db", "./stores/platform.db", "stores/../stores/platform.db"} {
		if got := ResolveStorePath(p); got != want {
			t.Errorf("ResolveStorePath(%q) = %s, want %s", p, got, want)
		}
	}
	if got := ResolveStorePath("/var/lib/platform/platform.db"); got != "/var/lib/platform/platform.db" {
		t.Errorf("an absolute path became %s", got)
	}

	admTester(t).InitServer(fmt.Sprintf(`{"admin": {"listen": %q}, "apps": {"platform": {"store": "stores/platform.db"}}}`, admAddr), "json")
	t.Cleanup((&admEnv{t: t}).stop)
	if got := admActiveApp(t).StorePath(); got != want {
		t.Errorf("running store %s, want %s", got, want)
	}
	if _, err := os.Stat(want); err != nil {
		t.Errorf("store file: %v", err)
	}
	if _, err := os.Stat("stores"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a store was created under the working directory: %v", err)
	}
}

// TestValidateLeavesStoreAlone runs `caddy validate` (a process of its
// own) on the config of the running server, which holds the store file,
// and on a config whose store does not exist yet: both are valid, and
// the second creates no file.
func TestValidateLeavesStoreAlone(t *testing.T) {
	env := admStart(t)
	cfg := filepath.Join(t.TempDir(), "caddy.json")
	os.WriteFile(cfg, []byte(env.config(filepath.Dir(env.dbPath), "")), 0o600)
	out, err := caddyProcess(t, nil, "validate", "--config", cfg)
	if err != nil || !strings.Contains(out, "Valid configuration") {
		t.Fatalf("validate while the server holds the store: %v\n%s", err, out)
	}

	fresh := filepath.Join(t.TempDir(), "new")
	other := &admEnv{t: t}
	os.WriteFile(cfg, []byte(other.config(fresh, "")), 0o600)
	out, err = caddyProcess(t, nil, "validate", "--config", cfg)
	if err != nil || !strings.Contains(out, "Valid configuration") {
		t.Fatalf("validate with a new store path: %v\n%s", err, out)
	}
	if _, err := os.Stat(other.dbPath); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("validate created %s: %v", other.dbPath, err)
	}
}

// TestStoreCLI backs up the running store through the admin API and
// checks files offline.
func TestStoreCLI(t *testing.T) {
	env := admStart(t)
	ctx := context.Background()
	_, hash, _ := servicekey.Generate()
	if err := env.app.DataStore().CreateKey(ctx, store.KeyRecord{ID: "key_backed", Hash: hash, UserID: "bob", Created: time.Now().UTC()}); err != nil {
		t.Fatal(err)
	}
	if out := cliMust(t, "store", "path"); !strings.Contains(out, env.dbPath) {
		t.Errorf("store path printed %q, want %s", out, env.dbPath)
	}

	dir := t.TempDir()
	backupPath := filepath.Join(dir, "backup.tar")
	if out := cliMust(t, "store", "backup", "--output", backupPath); !strings.Contains(out, "the copy checks") {
		t.Errorf("store backup printed %q", out)
	}
	if _, err := cliRun(t, "store", "backup", "--output", backupPath); err == nil || !strings.Contains(err.Error(), "--force") {
		t.Errorf("backup over an existing file: %v", err)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "*.partial")); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
	copyPath := filepath.Join(dir, "restored", "platform.db")
	if out := cliMust(t, "store", "restore", backupPath, copyPath); !strings.Contains(out, "both check") {
		t.Errorf("store restore printed %q", out)
	}
	if _, err := cliRun(t, "store", "restore", backupPath, copyPath); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Errorf("restore over a store: %v", err)
	}
	out := cliMust(t, "store", "check", copyPath)
	if !strings.Contains(out, "OK") || !strings.Contains(out, "Bucket keys:") || !strings.Contains(out, "Ledger:") {
		t.Errorf("store check printed:\n%s", out)
	}
	restored, err := boltstore.Open(copyPath)
	if err != nil {
		t.Fatal(err)
	}
	if k, err := restored.KeyByHash(ctx, hash); err != nil || k.ID != "key_backed" {
		t.Errorf("key in the backup: %+v, %v", k, err)
	}
	restored.Close()

	// The file the server holds is said to be in use, not damaged.
	if _, err := cliRun(t, "store", "check", env.dbPath); err == nil || !strings.Contains(err.Error(), "locked by another process") {
		t.Errorf("store check of the running store: %v", err)
	}
	damaged := filepath.Join(dir, "damaged.db")
	os.WriteFile(damaged, nil, 0o600)
	if _, err := cliRun(t, "store", "check", damaged); err == nil || !strings.Contains(err.Error(), "the file is empty") {
		t.Errorf("store check of an empty file: %v", err)
	}
	if _, err := cliRun(t, "store", "check", filepath.Join(dir, "missing.db")); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("store check of a missing file: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "missing.db")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("store check created the missing file")
	}
}

// TestDamageWhileServingAdmin breaks the store file under the running
// server: the admin API answers 500 internal_error (the process lives on),
// every later call fails the same way, and a reload onto the unusable
// store is refused until a restart.
func TestDamageWhileServingAdmin(t *testing.T) {
	env := admStart(t)
	for i := range 300 {
		_, hash, _ := servicekey.Generate()
		rec := store.KeyRecord{ID: fmt.Sprintf("key_%04d", i), Hash: hash, UserID: fmt.Sprintf("user-%d", i%7),
			Label: strings.Repeat("x", 200), Created: time.Now().UTC()}
		if err := env.app.DataStore().CreateKey(context.Background(), rec); err != nil {
			t.Fatal(err)
		}
	}
	if r := admDo(t, http.MethodGet, "/platform/keys", nil); r.status != http.StatusOK {
		t.Fatalf("keys before the damage: %d %s", r.status, r.body)
	}
	f, err := os.OpenFile(env.dbPath, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	st, _ := f.Stat()
	if _, err := f.WriteAt(bytes.Repeat([]byte{0xEE}, int(st.Size())-2*4096), 2*4096); err != nil {
		t.Fatal(err)
	}
	f.Close()
	for range 2 {
		r := admDo(t, http.MethodGet, "/platform/keys", nil)
		admExpectError(t, r, http.StatusInternalServerError, "internal_error", "")
	}
	if r := admDo(t, http.MethodGet, "/platform/store/backup", nil); r.status != http.StatusInternalServerError {
		t.Errorf("backup of the damaged store: %d %s", r.status, r.body)
	}
	status, body := admLoad(t, env.config(filepath.Dir(env.dbPath), ""))
	if status == http.StatusOK || !strings.Contains(body, "unusable") {
		t.Errorf("reload onto the damaged store: %d %s", status, body)
	}
}

// TestStartRefusesBadSettlementLog: a file beside the store named like a
// segment of its settlement log that is not one, or a log damaged before
// its end, stops `caddy run` with a plain exit and a message naming the
// file; the file is left alone.
func TestStartRefusesBadSettlementLog(t *testing.T) {
	for name, content := range map[string][]byte{
		"not ours": []byte("SQLite format 3\x00, not a settlement log of the gateway"),
		// The header of a segment starting at 0, then a record whose
		// checksum is wrong, then a sound-looking record after it.
		"damaged before its end": append(segmentHeader(), append(
			[]byte{3, 0, 0, 0, 0xde, 0xad, 0xbe, 0xef, 'a', 'b', 'c'},
			[]byte{1, 0, 0, 0, 0, 0, 0, 0, 0}...)...),
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "platform.db")
			// A store file first: without one, what is left of a store
			// is refused before the log is read (boltstore's
			// remainsWithoutFile).
			s, err := boltstore.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			seg := path + ".00000000000000000000.settle"
			os.WriteFile(seg, content, 0o600)
			cfg := filepath.Join(t.TempDir(), "caddy.json")
			storeJSON, _ := json.Marshal(path)
			os.WriteFile(cfg, []byte(`{"admin": {"disabled": true}, "apps": {"platform": {"store": `+string(storeJSON)+`}}}`), 0o600)
			out, err := caddyProcess(t, nil, "run", "--config", cfg)
			var exit *exec.ExitError
			if !errors.As(err, &exit) || !exit.Exited() || exit.ExitCode() == 0 {
				t.Fatalf("caddy run: %v (want a plain non-zero exit)\n%s", err, out)
			}
			if strings.Contains(out, "panic:") || !strings.Contains(out, seg) || !strings.Contains(out, "settlement log") {
				t.Fatalf("caddy run output does not name %s as a settlement log:\n%s", seg, out)
			}
			if after, _ := os.ReadFile(seg); !bytes.Equal(after, content) {
				t.Error("the refused segment changed")
			}
		})
	}
}

// segmentHeader is the header of a settlement log segment starting at 0
// (internal/store/settlelog: magic, version 1, start, CRC-32C of the 20 bytes).
func segmentHeader() []byte {
	h := make([]byte, 24)
	copy(h, "PGWSETL\x00")
	binary.LittleEndian.PutUint32(h[8:], 1)
	binary.LittleEndian.PutUint32(h[20:], crc32.Checksum(h[:20], crc32.MakeTable(crc32.Castagnoli)))
	return h
}
