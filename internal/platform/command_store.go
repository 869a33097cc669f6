package platform

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/platformgw/gateway/internal/store/boltstore"
)

// storeCommand is `caddy platform store`: where the store file is, a hot
// backup through the admin API, and an offline check of a file.
func storeCommand() *cobra.Command {
	st := &cobra.Command{
		Use:   "store",
		Short: "Shows, backs up, checks and migrates the store",
	}
	path := &cobra.Command{
		Use:   "path",
		Short: "Prints the store file the running gateway serves",
		Args:  cobra.NoArgs,
		RunE:  runCommand(cmdStorePath),
	}
	backup := &cobra.Command{
		Use:   "backup --output <file>",
		Short: "Writes a consistent copy of the running gateway's store to a file",
		Long: `
Copies the store of the running gateway through its admin API while it
serves: a tar of the store file (store.db) and its ledger directory
(store.db.ledger/), taken at one moment with every settlement acknowledged
before the backup began in both. The copy is written to <file>.partial,
synced, unpacked into a temporary directory and checked like 'caddy
platform store check', and only then renamed to <file>. An existing <file>
is not overwritten unless --force is given. Put it back with 'caddy
platform store restore'.

	caddy platform store backup --output /backups/platform-$(date +%F).tar`,
		Args: cobra.NoArgs,
		RunE: runCommand(cmdStoreBackup),
	}
	backup.Flags().StringP("output", "o", "", "File to write the copy to (required)")
	backup.Flags().Bool("force", false, "Replace <file> if it exists")
	restore := &cobra.Command{
		Use:   "restore <backup> <store file>",
		Short: "Unpacks a backup to a new store file and its ledger directory",
		Long: `
Unpacks a backup written by 'caddy platform store backup' (or GET
/platform/store/backup) to <store file> and <store file>.ledger/, checks
them like 'caddy platform store check', and moves them into place, the
ledger directory first. Neither may exist, nor a segment of the settlement
log of <store file> (<store file>.<position>.settle): stop the gateway,
move the old store file, its .ledger directory and its settlement log
segments away, restore, and start the gateway on <store file>.

	caddy platform store restore /backups/platform-2026-05-01.tar /var/lib/caddy/platform.db`,
		Args: cobra.ExactArgs(2),
		RunE: runCommand(cmdStoreRestore),
	}
	check := &cobra.Command{
		Use:   "check <file> | check --dsn <dsn>",
		Short: "Verifies a store file offline, or a fleet's PostgreSQL store",
		Long: `
Checks a store file without a running gateway, read-only: bbolt's meta
pages and their checksums, the file's size against the pages they count,
every page reachable from them, bbolt's own consistency check and the
platform's layout (its marker and buckets), the checksum of every record
(naming each damaged one by bucket and key), every ledger row, and the
counters against the ledger: used and spend of each subscription summed
over its periods against its ledger rows, reserved of each period against
the holds stored for it. Credit balances are not checked (a grant writes no
ledger row). It exits non-zero and says what is wrong with a damaged file
or names each figure that differs. A file a running gateway holds is locked: back
it up with 'caddy platform store backup' and check the copy.

With --dsn it checks a fleet's PostgreSQL database instead, read-only, in
one consistent snapshot, while the fleet serves: each rollup against the
ledger rows it sums, used and spend of each subscription against its ledger
rows (and the rollups of partitions retention dropped), leased_units and
leased_spend of each allowance and credits_held of each subscription
against the lease rows of the nodes and the jobs, and that every job's lease
is of an open job. Settlements waiting in a node's settlement log are in
neither the ledger nor the counters yet (their units are leased), so they
make no difference. A prune waits while the check runs.

	caddy platform store check --dsn "$PLATFORM_PG_DSN"`,
		Args: cobra.MaximumNArgs(1),
		RunE: runCommand(cmdStoreCheck),
	}
	check.Flags().String("dsn", "", "PostgreSQL connection string of a fleet's store to check instead of a file (a URL or key=value pairs)")
	st.AddCommand(path, backup, restore, check, storeMigrateCommand())
	return st
}

func cmdStorePath(c cli, _ []string) error {
	var v storeView
	if printed, err := c.call(http.MethodGet, storeAdminBase, nil, &v); printed || err != nil {
		return err
	}
	_, err := fmt.Fprintf(c.out, "%s (%d bytes)\n", v.Path, v.SizeBytes)
	return err
}

func cmdStoreBackup(c cli, _ []string) error {
	out, err := c.required("output")
	if err != nil {
		return err
	}
	if _, err := os.Stat(out); err == nil && !c.fl.Bool("force") {
		return fmt.Errorf("%s exists; pass --force to replace it", out)
	}
	resp, err := c.request(http.MethodGet, storeAdminBase+"backup", nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	partial := out + ".partial"
	n, err := writeSynced(partial, resp.Body)
	if err != nil {
		os.Remove(partial)
		return fmt.Errorf("backup to %s: %v", out, err)
	}
	if want, perr := strconv.ParseInt(resp.Header.Get("Content-Length"), 10, 64); perr == nil && n != want {
		os.Remove(partial)
		return fmt.Errorf("backup to %s: cut short, %d of %d bytes", out, n, want)
	}
	rep, err := checkBackup(partial)
	if err != nil {
		os.Remove(partial)
		return fmt.Errorf("backup to %s: the copy does not check: %v", out, err)
	}
	if err := os.Rename(partial, out); err != nil {
		os.Remove(partial)
		return err
	}
	if c.fl.Bool("json") {
		return json.NewEncoder(c.out).Encode(map[string]any{"output": out, "sizeBytes": n, "buckets": rep.Buckets,
			"ledgerRows": rep.LedgerRows})
	}
	_, err = fmt.Fprintf(c.out, "Backed up %d bytes (transaction %d, %d ledger rows) to %s; the copy checks.\n", n, rep.TxID, rep.LedgerRows, out)
	return err
}

// checkBackup unpacks the backup at path into a temporary directory and
// checks it.
func checkBackup(path string) (boltstore.Report, error) {
	f, err := os.Open(path)
	if err != nil {
		return boltstore.Report{}, err
	}
	defer f.Close()
	dir, err := os.MkdirTemp(filepath.Dir(path), ".platform-check-*")
	if err != nil {
		return boltstore.Report{}, err
	}
	defer os.RemoveAll(dir)
	return boltstore.Restore(f, filepath.Join(dir, "platform.db"))
}

func cmdStoreRestore(c cli, args []string) error {
	f, err := os.Open(args[0])
	if err != nil {
		return err
	}
	defer f.Close()
	rep, err := boltstore.Restore(f, args[1])
	if err != nil {
		return err
	}
	if c.fl.Bool("json") {
		return json.NewEncoder(c.out).Encode(map[string]any{"file": args[1], "ledger": boltstore.LedgerDir(args[1]),
			"buckets": rep.Buckets, "ledgerRows": rep.LedgerRows})
	}
	_, err = fmt.Fprintf(c.out, "Restored %s (transaction %d) and %s (%d ledger rows); both check. Start the gateway on %s.\n",
		args[1], rep.TxID, boltstore.LedgerDir(args[1]), rep.LedgerRows, args[1])
	return err
}

// writeSynced writes r to a new file at path and syncs it (and its
// directory) so the copy survives a crash right after.
func writeSynced(path string, r io.Reader) (int64, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return 0, err
	}
	n, err := io.Copy(f, r)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return n, err
	}
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		d.Sync()
		d.Close()
	}
	return n, nil
}

func cmdStoreCheck(c cli, args []string) error {
	if dsn := c.fl.String("dsn"); dsn != "" {
		if len(args) > 0 {
			return fmt.Errorf("check a store file (%s) or a database (--dsn), not both", args[0])
		}
		return cmdStoreCheckPostgres(c, dsn)
	}
	if len(args) == 0 {
		return errors.New("name the store file to check, or pass --dsn <dsn> to check a fleet's PostgreSQL store")
	}
	rep, err := boltstore.CheckFile(args[0])
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%s does not exist", args[0])
	}
	if err != nil {
		return err
	}
	if c.fl.Bool("json") {
		return json.NewEncoder(c.out).Encode(map[string]any{"file": args[0], "ok": true, "sizeBytes": rep.Size,
			"pageSize": rep.PageSize, "pages": rep.HighWater, "txid": rep.TxID, "buckets": rep.Buckets,
			"ledgerRows": rep.LedgerRows, "recordsChecked": rep.Records, "recordsUnsealed": rep.Unsealed,
			"countersChecked": rep.Cross.Skipped == "", "countersSkipped": rep.Cross.Skipped, "accounts": rep.Cross.Accounts})
	}
	tw := tabwriter.NewWriter(c.out, 0, 0, 1, ' ', 0)
	fmt.Fprintf(tw, "File:\t%s\n", args[0])
	fmt.Fprintf(tw, "Size:\t%d bytes, %d pages of %d bytes in use\n", rep.Size, rep.HighWater, rep.PageSize)
	fmt.Fprintf(tw, "Transaction:\t%d\n", rep.TxID)
	fmt.Fprintf(tw, "Ledger:\t%d rows in %s, every checksum checked\n", rep.LedgerRows, boltstore.LedgerDir(args[0]))
	if rep.Unsealed {
		fmt.Fprintf(tw, "Records:\tof an earlier build, without checksums; the next start adds them\n")
	} else {
		fmt.Fprintf(tw, "Records:\t%d, every checksum checked\n", rep.Records)
	}
	if rep.Cross.Skipped != "" {
		fmt.Fprintf(tw, "Counters:\treserved checked against the stored holds; used and spend not checked: %s\n", rep.Cross.Skipped)
	} else {
		fmt.Fprintf(tw, "Counters:\tused and spend of %d accounts equal their ledger rows, reserved their stored holds\n", rep.Cross.Accounts)
	}
	fmt.Fprintf(tw, "Balances:\tnot checked: a credit grant writes no ledger row, so a balance cannot be derived\n")
	names := make([]string, 0, len(rep.Buckets))
	for name := range rep.Buckets {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		fmt.Fprintf(tw, "Bucket %s:\t%d entries\n", name, rep.Buckets[name])
	}
	fmt.Fprintln(tw, "Result:\tOK (meta pages, size, every page, bbolt check, platform layout, record checksums, counters)")
	return tw.Flush()
}
