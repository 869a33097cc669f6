package platform

import (
	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/engine"
	"github.com/platformgw/gateway/internal/ops"
	"github.com/platformgw/gateway/internal/store"
)

// appOver is an App around s as the admin API's handlers see it, with no
// Caddy: its runtime and operations over s, an empty catalog.
func appOver(s store.Store) *App {
	a := &App{store: s, logger: zap.NewNop()}
	a.rt = engine.New(engine.Runtime{OpenStore: a.DataStore, Logger: a.logger, Clock: a.Now})
	a.ops = ops.New(a.rt, nil)
	return a
}
