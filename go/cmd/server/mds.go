//go:build linux

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dfkv/dfkv/go/internal/mdsclient"
	"github.com/dfkv/dfkv/go/internal/secure"
	"github.com/dfkv/dfkv/go/internal/version"
	"github.com/dfkv/dfkv/go/internal/wire"
	"github.com/dfkv/dfkv/go/ring"
)

// mdsFlags are the node-lifecycle flags: with --mds the node registers itself in a group's
// ring and heartbeats until it stops.
type mdsFlags struct {
	fs                           *flag.FlagSet
	endpoints, group, id, advert string
	weight                       uint
	tlsCA, tlsCert, tlsKey       string
	tokenFile                    string
	// extra is appended to the member's configuration (the KV-event endpoints).
	extra []wire.KV
}

func (f *mdsFlags) define(fs *flag.FlagSet) {
	f.fs = fs
	fs.StringVar(&f.endpoints, "mds", "", "MDS replicas host:port[,...]: register this node in --group's ring (needs --id and --advertise)")
	fs.StringVar(&f.group, "group", "default", "MDS group (one ring) this node joins")
	fs.StringVar(&f.id, "id", "", "node id in the ring (stable across restarts: it decides which keys this node owns)")
	fs.StringVar(&f.advert, "advertise", "", "data address clients dial, HOST:PORT (PORT 0 = the bound port)")
	fs.UintVar(&f.weight, "weight", 1, "ring weight (share of keys relative to other nodes)")
	fs.StringVar(&f.tlsCA, "mds-tls-ca", "", "dial the MDS with TLS 1.3, verifying it against this PEM CA")
	fs.StringVar(&f.tlsCert, "mds-tls-cert", "", "client certificate for an MDS that requires one (with --mds-tls-key)")
	fs.StringVar(&f.tlsKey, "mds-tls-key", "", "private key of --mds-tls-cert")
	fs.StringVar(&f.tokenFile, "mds-token-file", "", "file holding the admin token the MDS wants for registration (MDS run with --auth-tokens)")
}

// rpcOptions builds the MDS client's TLS and token settings from the flags.
func (f *mdsFlags) rpcOptions() (mdsclient.Options, error) {
	var o mdsclient.Options
	files := secure.TLSFiles{CA: f.tlsCA, Cert: f.tlsCert, Key: f.tlsKey}
	if files.ClientEnabled() {
		t, err := secure.LoadClient(files, nil)
		if err != nil {
			return o, fmt.Errorf("--mds-tls-*: %w", err)
		}
		o.TLS = t.Config()
	}
	if f.tokenFile != "" {
		b, err := os.ReadFile(f.tokenFile)
		if err != nil {
			return o, fmt.Errorf("--mds-token-file: %w", err)
		}
		o.Token = strings.TrimSpace(string(b))
	}
	return o, nil
}

// validate refuses an MDS configuration that cannot work, before anything starts.
func (f *mdsFlags) validate() error {
	if f.endpoints == "" {
		return nil
	}
	if _, err := mdsclient.ParseEndpoints(f.endpoints); err != nil {
		return fmt.Errorf("--mds: %w", err)
	}
	if f.id == "" || f.advert == "" {
		return errors.New("--mds requires --id and --advertise (the node's ring id and the address clients dial)")
	}
	host, _, err := net.SplitHostPort(f.advert)
	if err != nil {
		return fmt.Errorf("--advertise %q: want HOST:PORT: %w", f.advert, err)
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		return fmt.Errorf("--advertise %q: clients cannot dial an unspecified host", f.advert)
	}
	if f.weight < 1 || f.weight > ring.MaxWeight {
		return fmt.Errorf("--weight %d: want 1..%d", f.weight, ring.MaxWeight)
	}
	_, err = f.rpcOptions()
	return err
}

// flagValue returns another flag's value ("" when this build has no such flag), so the
// registered configuration follows whatever flags the binary has.
func (f *mdsFlags) flagValue(name string) string {
	if fl := f.fs.Lookup(name); fl != nil {
		return fl.Value.String()
	}
	return ""
}

// nodeRegistration is the node's MDS lease holder; the zero value (no --mds) is always ready.
type nodeRegistration struct {
	h *mdsclient.Holder

	mu     sync.Mutex
	member wire.Member // the registered record; rails replaced by updateRails
}

// start registers the node (in the background: a missing MDS delays readiness, not
// startup). bound is the listener's address, used for an --advertise port of 0.
func (r *nodeRegistration) start(f *mdsFlags, bound string, rails []wire.Rail, log *slog.Logger) error {
	if f.endpoints == "" {
		return nil
	}
	eps, err := mdsclient.ParseEndpoints(f.endpoints)
	if err != nil {
		return err
	}
	addr := f.advert
	if host, port, _ := net.SplitHostPort(addr); port == "0" {
		_, bp, _ := net.SplitHostPort(bound)
		addr = net.JoinHostPort(host, bp)
	}
	cfg := []wire.KV{{Key: "engine", Value: f.flagValue("store-engine")}, {Key: "capacity", Value: f.flagValue("cap")},
		{Key: "transport", Value: "tcp"}, {Key: "max_msg", Value: f.flagValue("max-msg")},
		{Key: "tls", Value: onOff(f.flagValue("tls-cert") != "")}, {Key: "auth_tokens", Value: onOff(f.flagValue("auth-tokens") != "")},
		{Key: "disks", Value: strconv.Itoa(len(strings.Split(f.flagValue("dir"), ",")))}}
	// The MDS's /status page scrapes this address for the node's capacity and hit rate.
	if mp := f.flagValue("metrics-port"); mp != "" && mp != "0" {
		host, _, _ := net.SplitHostPort(addr)
		cfg = append(cfg, wire.KV{Key: wire.MemberMetricsAddrKey, Value: net.JoinHostPort(host, mp)})
	}
	if on := f.flagValue("ram-tier"); on == "true" {
		cfg = append(cfg, wire.KV{Key: "ram_tier", Value: "on"}, wire.KV{Key: "ram_tier_bytes", Value: f.flagValue("ram-tier-bytes")},
			wire.KV{Key: "ram_tier_policy", Value: f.flagValue("ram-tier-policy")})
	} else {
		cfg = append(cfg, wire.KV{Key: "ram_tier", Value: "off"})
	}
	cfg = append(cfg, f.extra...)
	member := &wire.Member{ID: f.id, Addr: addr, Weight: uint32(f.weight), Eligible: true, Version: version.Version, Config: cfg, Rails: rails}
	r.mu.Lock()
	r.member = *member
	r.mu.Unlock()
	ropts, err := f.rpcOptions()
	if err != nil {
		return err
	}
	rpc, err := mdsclient.New(eps, ropts)
	if err != nil {
		return err
	}
	h, err := mdsclient.NewHolder(mdsclient.HolderConfig{Client: rpc, Group: f.group, Member: member, Logger: log})
	if err != nil {
		return err
	}
	r.h = h
	h.Start()
	log.Info("registering with mds", "mds", strings.Join(eps, ","), "group", f.group, "id", f.id, "advertise", addr, "weight", f.weight)
	return nil
}

// updateRails re-publishes the member with the rails' new state (no-op without --mds).
func (r *nodeRegistration) updateRails(rails []wire.Rail) {
	if r.h == nil {
		return
	}
	r.mu.Lock()
	r.member.Rails = rails
	m := r.member
	r.mu.Unlock()
	_ = r.h.UpdateMember(&m) // same id: cannot fail
}

// ready is part of /readyz: nil once the first registration succeeded.
func (r *nodeRegistration) ready() error {
	if r.h == nil {
		return nil
	}
	select {
	case <-r.h.FirstRegistered():
		return nil
	default:
		return errors.New("not registered with the MDS yet")
	}
}

// stop deregisters so clients move off this node at once instead of after the lease TTL.
func (r *nodeRegistration) stop(log *slog.Logger) {
	if r.h == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := r.h.Stop(ctx); err != nil {
		log.Warn("mds deregistration failed; the lease will expire", "err", err)
	} else {
		log.Info("deregistered from mds")
	}
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}
