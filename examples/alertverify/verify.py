#!/usr/bin/env python3
"""Checks one usage alert webhook of the gateway (docs/alerts.md,
"Verifying it") as a receiver must: the signature over the raw body and
the timestamp, the timestamp within five minutes of now, and the event id
against the ids already processed, so a replayed or retried webhook is
acknowledged without being acted on twice. verify.go and verify.js beside
it are the same in Go and JavaScript; verify_test.go runs all three
against webhooks signed by the gateway's own code.

    ALERT_SECRET=... ALERT_SEEN_FILE=seen.txt python3 verify.py <X-Platform-Timestamp> <X-Platform-Signature> < body

prints "accepted <eventId>" or "duplicate <eventId>" (answer 2xx to both)
or "refused: <why>" and exits 1 (answer 401). ALERT_NOW, in Unix seconds,
replaces the clock (tests).
"""
import base64
import hashlib
import hmac
import json
import os
import sys
import time

# How far a webhook's timestamp may be from now: the gateway signs each
# attempt when it sends it, so a genuine delivery is seconds old.
WINDOW = 300


class Refused(Exception):
    pass


def verify(secret: bytes, body: bytes, timestamp: str, signature: str, now: float) -> str:
    """Checks the signature and the timestamp; returns the event id from
    the signed body (the X-Platform-Event-ID header is not signed)."""
    if not (timestamp.isascii() and timestamp.isdigit()):
        raise Refused("missing or malformed timestamp")
    want = base64.b64encode(hmac.new(secret, body + timestamp.encode(), hashlib.sha256).digest())
    if not hmac.compare_digest(want, signature.encode()):
        raise Refused("bad signature")
    if abs(now - int(timestamp)) > WINDOW:
        raise Refused("timestamp outside the window")
    try:
        event_id = json.loads(body).get("eventId")
    except (ValueError, AttributeError):
        event_id = None
    if not isinstance(event_id, str) or not event_id:
        raise Refused("no eventId in the body")
    return event_id


def handle(secret, body, timestamp, signature, seen_path, now, act):
    """A receiver's whole check: verify, then act once per event id. The
    seen file (use your database) keeps the ids processed, one a line, at
    least as long as the gateway retries an alert (give_up_after, 24h by
    default) plus WINDOW; an id is recorded once act succeeded."""
    event_id = verify(secret, body, timestamp, signature, now)
    try:
        with open(seen_path, encoding="utf-8") as f:
            if event_id in (line.rstrip("\n") for line in f):
                return "duplicate " + event_id
    except FileNotFoundError:
        pass
    act(event_id)
    with open(seen_path, "a", encoding="utf-8") as f:
        f.write(event_id + "\n")
    return "accepted " + event_id


def main() -> int:
    secret, seen = os.environ.get("ALERT_SECRET", ""), os.environ.get("ALERT_SEEN_FILE", "")
    if len(sys.argv) != 3 or not secret or not seen:
        print("refused: usage: ALERT_SECRET=... ALERT_SEEN_FILE=... verify.py <timestamp> <signature> < body")
        return 1
    now = float(os.environ["ALERT_NOW"]) if os.environ.get("ALERT_NOW") else time.time()
    body = sys.stdin.buffer.read(1 << 20)
    try:
        # act: tell whoever must know.
        print(handle(secret.encode(), body, sys.argv[1], sys.argv[2], seen, now, lambda event_id: None))
    except Refused as e:
        print("refused:", e)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
