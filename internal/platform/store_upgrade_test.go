package platform

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRelativeStoreLeftInWorkingDir: gateways before relative store paths
// were taken under Caddy's data directory took them under the working
// directory. After an upgrade the same setting names another, missing,
// file; starting an empty store there would turn every key into
// invalid_key and hide every credit, the switch a reload is refused for.
// The load is refused naming both files, nothing is created, and once the
// file is moved the same config serves it.
func TestRelativeStoreLeftInWorkingDir(t *testing.T) {
	data := t.TempDir()
	t.Setenv("XDG_DATA_HOME", data)
	work := t.TempDir()
	t.Chdir(work)
	old := filepath.Join(work, "stores", "platform.db")
	keyID := fillStore(t, old)
	want := filepath.Join(data, "caddy", "stores", "platform.db")

	admTester(t).InitServer(fmt.Sprintf(`{"admin": {"listen": %q}}`, admAddr), "json")
	t.Cleanup((&admEnv{t: t}).stop)
	cfg := fmt.Sprintf(`{"admin": {"listen": %q}, "apps": {"platform": {"store": "stores/platform.db"}}}`, admAddr)
	status, body := admLoad(t, cfg)
	if status == http.StatusOK || !strings.Contains(body, old) || !strings.Contains(body, want) {
		t.Fatalf("load with the store left under the working directory: %d %s; want a refusal naming %s and %s", status, body, old, want)
	}
	if _, err := os.Stat(want); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("an empty store was started at %s: %v", want, err)
	}

	if err := os.MkdirAll(filepath.Dir(want), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(old, want); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(old+".ledger", want+".ledger"); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	if status, body := admLoad(t, cfg); status != http.StatusOK {
		t.Fatalf("load after moving the store: %d %s", status, body)
	}
	if _, err := admActiveApp(t).DataStore().KeyByID(context.Background(), keyID); err != nil {
		t.Fatalf("a key of the moved store: %v", err)
	}
}
