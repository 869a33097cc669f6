#!/usr/bin/env node
// Checks one usage alert webhook of the gateway (docs/alerts.md,
// "Verifying it") as a receiver must: the signature over the raw body and
// the timestamp, the timestamp within five minutes of now, and the event
// id against the ids already processed, so a replayed or retried webhook
// is acknowledged without being acted on twice. verify.go and verify.py
// beside it are the same in Go and Python; verify_test.go runs all three
// against webhooks signed by the gateway's own code. Node.js, no packages.
//
//   ALERT_SECRET=... ALERT_SEEN_FILE=seen.txt node verify.js <X-Platform-Timestamp> <X-Platform-Signature> < body
//
// prints "accepted <eventId>" or "duplicate <eventId>" (answer 2xx to
// both) or "refused: <why>" and exits 1 (answer 401). ALERT_NOW, in Unix
// seconds, replaces the clock (tests).
"use strict";
const crypto = require("crypto");
const fs = require("fs");

// How far a webhook's timestamp may be from now: the gateway signs each
// attempt when it sends it, so a genuine delivery is seconds old.
const WINDOW = 300;

class Refused extends Error {}

// verify checks the signature and the timestamp and returns the event id
// from the signed body (the X-Platform-Event-ID header is not signed).
// body is the raw Buffer received, never a re-serialized object.
function verify(secret, body, timestamp, signature, now) {
  if (!/^[0-9]+$/.test(timestamp)) throw new Refused("missing or malformed timestamp");
  const want = crypto.createHmac("sha256", secret).update(body).update(timestamp).digest("base64");
  const a = Buffer.from(want), b = Buffer.from(signature);
  if (a.length !== b.length || !crypto.timingSafeEqual(a, b)) throw new Refused("bad signature");
  if (Math.abs(now - Number(timestamp)) > WINDOW) throw new Refused("timestamp outside the window");
  let eventId;
  try {
    eventId = JSON.parse(body.toString("utf8")).eventId;
  } catch (e) {
    eventId = undefined;
  }
  if (typeof eventId !== "string" || eventId === "") throw new Refused("no eventId in the body");
  return eventId;
}

// handle is a receiver's whole check: verify, then act once per event id.
// The seen file (use your database) keeps the ids processed, one a line,
// at least as long as the gateway retries an alert (give_up_after, 24h by
// default) plus WINDOW; an id is recorded once act succeeded.
function handle(secret, body, timestamp, signature, seenPath, now, act) {
  const eventId = verify(secret, body, timestamp, signature, now);
  let seen = [];
  try {
    seen = fs.readFileSync(seenPath, "utf8").split("\n");
  } catch (e) {
    if (e.code !== "ENOENT") throw e;
  }
  if (seen.includes(eventId)) return "duplicate " + eventId;
  act(eventId);
  fs.appendFileSync(seenPath, eventId + "\n");
  return "accepted " + eventId;
}

function main() {
  const secret = process.env.ALERT_SECRET || "", seen = process.env.ALERT_SEEN_FILE || "";
  const args = process.argv.slice(2);
  if (args.length !== 2 || !secret || !seen) {
    console.log("refused: usage: ALERT_SECRET=... ALERT_SEEN_FILE=... node verify.js <timestamp> <signature> < body");
    return 1;
  }
  const now = process.env.ALERT_NOW ? Number(process.env.ALERT_NOW) : Date.now() / 1000;
  const body = fs.readFileSync(0); // stdin, as raw bytes
  try {
    // act: tell whoever must know.
    console.log(handle(secret, body, args[0], args[1], seen, now, () => {}));
  } catch (e) {
    if (!(e instanceof Refused)) throw e;
    console.log("refused: " + e.message);
    return 1;
  }
  return 0;
}

module.exports = { verify, handle, Refused, WINDOW };

if (require.main === module) process.exitCode = main();
