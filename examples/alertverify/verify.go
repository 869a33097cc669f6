// Command alertverify checks one usage alert webhook of the gateway
// (docs/alerts.md, "Verifying it") as a receiver must: the signature over
// the raw body and the timestamp, the timestamp within five minutes of
// now, and the event id against the ids already processed, so a replayed
// or retried webhook is acknowledged without being acted on twice.
// verify.py and verify.js beside it are the same in Python and
// JavaScript; verify_test.go runs all three against webhooks signed by
// the gateway's own code.
//
// As a command (how the test drives it):
//
//	ALERT_SECRET=... ALERT_SEEN_FILE=seen.txt alertverify <X-Platform-Timestamp> <X-Platform-Signature> < body
//
// prints "accepted <eventId>" or "duplicate <eventId>" (answer 2xx to
// both) or "refused: <why>" and exits 1 (answer 401). ALERT_NOW, in Unix
// seconds, replaces the clock (tests).
package main

import (
	"bufio"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"
)

// Window is how far a webhook's timestamp may be from now: the gateway
// signs each attempt when it sends it, so a genuine delivery is seconds
// old; an older one is a replay.
const Window = 5 * time.Minute

// Verify checks a webhook's signature and timestamp and returns the event
// id from its signed body (the X-Platform-Event-ID header is not signed:
// never trust it alone).
func Verify(secret, body []byte, timestamp, signature string, now time.Time) (string, error) {
	sec, err := strconv.ParseInt(timestamp, 10, 64)
	if err != nil || timestamp == "" || timestamp[0] == '+' || timestamp[0] == '-' {
		return "", errors.New("missing or malformed timestamp")
	}
	m := hmac.New(sha256.New, secret)
	m.Write(body)
	m.Write([]byte(timestamp))
	want := base64.StdEncoding.EncodeToString(m.Sum(nil))
	if !hmac.Equal([]byte(want), []byte(signature)) {
		return "", errors.New("bad signature")
	}
	if d := now.Sub(time.Unix(sec, 0)); d > Window || d < -Window {
		return "", errors.New("timestamp outside the window")
	}
	var event struct {
		EventID string `json:"eventId"`
	}
	if err := json.Unmarshal(body, &event); err != nil || event.EventID == "" {
		return "", errors.New("no eventId in the body")
	}
	return event.EventID, nil
}

// Handle is a receiver's whole check: verify, then act once per event id.
// seen is the file of the event ids already processed, one a line (use
// your database; keep an id at least as long as the gateway retries an
// alert, give_up_after, 24h by default, plus Window). act runs only for a
// new event; its id is recorded once act succeeded.
func Handle(secret, body []byte, timestamp, signature, seen string, now time.Time, act func(eventID string) error) (string, error) {
	id, err := Verify(secret, body, timestamp, signature, now)
	if err != nil {
		return "", err
	}
	done, err := seenBefore(seen, id)
	if err != nil {
		return "", err
	}
	if done {
		return "duplicate " + id, nil
	}
	if err := act(id); err != nil {
		return "", err
	}
	f, err := os.OpenFile(seen, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return "", err
	}
	if _, err := fmt.Fprintln(f, id); err != nil {
		f.Close()
		return "", err
	}
	return "accepted " + id, f.Close()
}

func seenBefore(path, id string) (bool, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if sc.Text() == id {
			return true, nil
		}
	}
	return false, sc.Err()
}

// run is the command: its arguments, environment, input and output are
// passed in, so the test runs it as it runs the other two.
func run(args []string, getenv func(string) string, stdin io.Reader, stdout io.Writer) int {
	if len(args) != 2 || getenv("ALERT_SECRET") == "" || getenv("ALERT_SEEN_FILE") == "" {
		fmt.Fprintln(stdout, "refused: usage: ALERT_SECRET=... ALERT_SEEN_FILE=... alertverify <timestamp> <signature> < body")
		return 1
	}
	now := time.Now()
	if s := getenv("ALERT_NOW"); s != "" {
		sec, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			fmt.Fprintln(stdout, "refused: ALERT_NOW is not Unix seconds")
			return 1
		}
		now = time.Unix(sec, 0)
	}
	body, err := io.ReadAll(io.LimitReader(stdin, 1<<20))
	if err != nil {
		fmt.Fprintln(stdout, "refused: reading the body:", err)
		return 1
	}
	out, err := Handle([]byte(getenv("ALERT_SECRET")), body, args[0], args[1], getenv("ALERT_SEEN_FILE"), now,
		func(string) error { return nil }) // act: tell whoever must know
	if err != nil {
		fmt.Fprintln(stdout, "refused:", strings.TrimSpace(err.Error()))
		return 1
	}
	fmt.Fprintln(stdout, out)
	return 0
}

func main() {
	os.Exit(run(os.Args[1:], os.Getenv, os.Stdin, os.Stdout))
}
