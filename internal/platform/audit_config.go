package platform

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/ops"
	"github.com/platformgw/gateway/internal/store"
)

// The settings of a config that say where alerts go and how long billing
// data is kept are audited when they change (ops.AuditConfigChange).

// configActor names the author of a config change: the config API, a
// reload or a restart with an edited Caddyfile cannot tell who.
const configActor = "config"

// configAuditScan bounds how many audit entries a start reads back to
// find each setting's last recorded value (newest first). A setting not
// found among them is recorded again: a restatement, never a miss.
const configAuditScan = 10000

// auditedSetting is a setting whose every change is audited, with its
// value as recorded: never a secret.
type auditedSetting struct{ name, value string }

// auditedSettings are this config's settings that decide where alerts go
// and how long billing data is kept. The alert secret is not among them:
// nothing derived from it is ever recorded.
func (a *App) auditedSettings() []auditedSetting {
	webhook, signing := "none (no alerts block)", "none (no alerts block)"
	if a.alerter != nil {
		webhook = recordedWebhook(a.alerter.webhook)
		signing = "the alerts block's secret"
		if a.Alerts.byService() {
			signing = "each service's secret (sign_with service)"
		}
	}
	return []auditedSetting{
		{"alerts webhook", webhook},
		{"alerts signing", signing},
		{"ledger_retention", recordedRetention(a.LedgerRetention)},
		{"rollup_retention", recordedRetention(a.RollupRetention)},
	}
}

// recordedWebhook is the webhook URL as the audit log and the log line
// show it: its scheme and host, where alerts go, and of the rest (path and
// query) only a fingerprint, the first 8 hex digits of its SHA-256. A
// receiver's token travels in the path as often as in the query (Slack's
// and Zapier's hook URLs are /services/T…/B…/<token>), and no log line may
// hold a secret (catalog.ShownURL); a change of path or query is still a
// change of the recorded value, and so still audited. Credentials in the
// URL are refused by validWebhookURL.
func recordedWebhook(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.Scheme == "" || u.Host == "" {
		return "(unparsable URL)"
	}
	out := u.Scheme + "://" + u.Host
	rest := u.EscapedPath()
	if u.RawQuery != "" || u.ForceQuery {
		rest += "?" + u.RawQuery
	}
	if rest == "" || rest == "/" {
		return out + rest
	}
	sum := sha256.Sum256([]byte(rest))
	return out + "/… (path and query not recorded: fingerprint " + hex.EncodeToString(sum[:4]) + ")"
}

func recordedRetention[D ~int64](d D) string {
	if d <= 0 {
		return "unset (kept for ever)"
	}
	return time.Duration(d).String()
}

// auditConfig records each audited setting of this config that differs
// from the value the audit log last recorded for it (a setting never
// recorded counts as its default: no alerts, no retention). Start runs
// it once the store is open: a reload through the config API, `caddy
// reload` and a restart with an edited Caddyfile are all recorded, and
// `caddy validate` (which never starts) records nothing.
func (a *App) auditConfig(ctx context.Context) error {
	settings := a.auditedSettings()
	last := map[string]string{}
	for _, s := range (&App{}).auditedSettings() {
		last[s.name] = s.value // the defaults, until an entry says otherwise
	}
	found := map[string]bool{}
	cursor, read := "", 0
	for read < configAuditScan && len(found) < len(settings) {
		entries, next, err := a.DataStore().ListAudit(ctx, cursor, ops.MaxPageLimit)
		if err != nil {
			return fmt.Errorf("reading the audit log for the last recorded settings: %w", err)
		}
		for _, e := range entries {
			if e.Action != ops.AuditConfigChange {
				continue
			}
			name, value, ok := strings.Cut(e.Detail, ": ")
			if _, known := last[name]; ok && known && !found[name] {
				last[name], found[name] = value, true
			}
		}
		read += len(entries)
		if next == "" {
			break
		}
		cursor = next
	}
	var errs []error
	for _, s := range settings {
		if last[s.name] == s.value {
			continue
		}
		a.logger.Info("audited setting changed", zap.String("setting", s.name), zap.String("value", s.value))
		if err := a.ops.RecordAudit(ctx, store.AuditEntry{Actor: configActor, Action: ops.AuditConfigChange, Detail: s.name + ": " + s.value}); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
