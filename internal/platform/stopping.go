package platform

import (
	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// stopNotified is a store that answers, once the process begins to exit,
// the calls waiting for their settlements to be written (a fleet node
// whose database does not answer: pgstore.Store.Stopping).
type stopNotified interface{ Stopping() }

// answerAtStop has every server of the http app being provisioned that
// hosts a platform handler tell the store, as its shutdown begins, when
// the process is exiting (caddy stop, a signal). A caller whose call was
// served and whose settlement waits for the database is then answered
// while the server still waits for it: with a grace_period shorter than
// that wait (10 s), the server stopped waiting first and the answer was
// written only as the store closed, just before the process exited, and
// could lose that race (the connection closed without an answer, the
// call charged all the same; TestFleetCommitStopDuringOutage). A config
// reload shuts the old servers down too, but the process goes on and so
// does the store, shared with the new config: their calls wait for their
// settlements as before (caddy.Exiting says which). FromContext runs it
// from each platform handler's Provision, before the http app's Start
// builds the net/http servers from the hooks registered.
func (a *App) answerAtStop(ctx caddy.Context) {
	app := provisioningHTTPApp(ctx)
	if app == nil {
		return
	}
	for _, srv := range app.Servers {
		if srv == nil || a.stopHooked[srv] || !hostsPlatform(srv) {
			continue
		}
		if a.stopHooked == nil {
			a.stopHooked = map[*caddyhttp.Server]bool{}
		}
		a.stopHooked[srv] = true
		srv.RegisterOnShutdown(a.serverStopping)
	}
}

// serverStopping runs as a server hosting platform handlers begins to
// shut down (net/http runs it in a goroutine of its own).
func (a *App) serverStopping() {
	if !caddy.Exiting() {
		return // a reload, or a config unloaded: the process goes on
	}
	if h := a.held.Load(); h != nil {
		if s, ok := h.Store.(stopNotified); ok {
			s.Stopping()
		}
	}
}
