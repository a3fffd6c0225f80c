//go:build !(linux && cgo)

package ibverbs

import (
	"fmt"

	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs"
)

// DefaultLibrary is the soname dlopen'ed when Options.Library is empty.
const DefaultLibrary = "libibverbs.so.1"

// Options configures the provider.
type Options struct {
	Library  string
	SysClass string
}

// Provider reports that this build has no ibverbs support.
type Provider struct{}

// New returns a provider that is always unavailable in this build.
func New(Options) *Provider { return &Provider{} }

// Name implements verbs.Provider.
func (p *Provider) Name() string { return "ibverbs" }

var errNoCgo = fmt.Errorf("%w: ibverbs: this build has no cgo (linux+cgo required)", verbs.ErrUnavailable)

// Devices implements verbs.Provider.
func (p *Provider) Devices() ([]verbs.DeviceInfo, error) { return nil, errNoCgo }

// Open implements verbs.Provider.
func (p *Provider) Open(string) (verbs.Context, error) { return nil, errNoCgo }
