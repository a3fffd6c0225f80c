package cabi

import (
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/dfkv/dfkv/go/client"
	"github.com/dfkv/dfkv/go/internal/mdsclient"
	"github.com/dfkv/dfkv/go/ring"
)

// MDS discovery is linked into every build of the C ABI: dfkv_open_v2 with mds_endpoints
// (and no static members) follows the group's topology through the MDS, and registers the
// process under the group's clients prefix when flags has FlagRegisterWithMDS (unless
// DFKV_CLIENT_REGISTER=0).
func init() {
	if MembershipFactory == nil {
		MembershipFactory = OpenMDS
	}
}

// Tunables read from the environment (the options struct is frozen by the ABI).
const (
	envShrinkPolls = "DFKV_MDS_SHRINK_POLLS" // consecutive polls a >50% shrink must persist (default 3)
	envCallTimeout = "DFKV_MDS_TIMEOUT_MS"   // per-replica request deadline (default 2000)
	envRegister    = "DFKV_CLIENT_REGISTER"  // "0": never register, whatever the flags say
	envFanout      = "DFKV_FANOUT_THREADS"   // batch chunk goroutines per client (default 32)
	// How long the MDS may hold a topology request until the ring changes (default
	// client.DefaultLongPoll); 0 turns long polls off (a plain poll every mds_poll_ms).
	envLongPoll = "DFKV_MDS_LONG_POLL_MS"
	// The placement ring's density (default ring.PointsPerWeight); 160 routes like the first
	// releases, for a rolling upgrade.
	envRingPoints = "DFKV_RING_POINTS_PER_WEIGHT"
)

// ringPoints returns the density DFKV_RING_POINTS_PER_WEIGHT asks for (0 = the default),
// validated so a bad value fails dfkv_open_v2 instead of every topology poll.
func ringPoints() (int, error) {
	n, err := envInt(envRingPoints, 0)
	if err != nil {
		return 0, err
	}
	if _, err := ring.New(nil, ring.WithPointsPerWeight(n)); err != nil {
		return 0, fmt.Errorf("%s: %w", envRingPoints, err)
	}
	return n, nil
}

func envInt(name string, def int) (int, error) {
	v, ok := os.LookupEnv(name)
	if !ok || strings.TrimSpace(v) == "" {
		return def, nil
	}
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("%s=%q: want a positive integer", name, v)
	}
	return n, nil
}

// mdsLogger writes to stderr at warn level, or at the level DFKV_LOG names (debug, info).
func mdsLogger() *slog.Logger {
	lvl := slog.LevelWarn
	switch strings.ToLower(os.Getenv("DFKV_LOG")) {
	case "debug":
		lvl = slog.LevelDebug
	case "info", "1":
		lvl = slog.LevelInfo
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
}

// OpenMDS builds the MDS membership from C ABI options.
func OpenMDS(o *Options) (client.Membership, error) {
	mo, err := mdsOptions(o)
	if err != nil {
		return nil, err
	}
	return client.NewMDSMembership(mo)
}

// mdsOptions turns the C ABI options and the environment into the library's MDS options
// (the library itself reads no environment).
func mdsOptions(o *Options) (client.MDSOptions, error) {
	eps, err := mdsclient.ParseEndpoints(o.MDSEndpoints)
	if err != nil {
		return client.MDSOptions{}, fmt.Errorf("mds_endpoints: %w", err)
	}
	info, err := mdsclient.ParseInfo(o.ClientInfo)
	if err != nil {
		return client.MDSOptions{}, err
	}
	if o.MDSPollMS < 0 || o.ClientHeartbeatMS < 0 {
		return client.MDSOptions{}, fmt.Errorf("mds_poll_ms %d / client_heartbeat_ms %d: negative", o.MDSPollMS, o.ClientHeartbeatMS)
	}
	shrink, err := envInt(envShrinkPolls, 3)
	if err != nil {
		return client.MDSOptions{}, err
	}
	timeoutMS, err := envInt(envCallTimeout, 2000)
	if err != nil {
		return client.MDSOptions{}, err
	}
	points, err := ringPoints()
	if err != nil {
		return client.MDSOptions{}, err
	}
	longPoll := time.Duration(0) // the library's default
	if v := strings.TrimSpace(os.Getenv(envLongPoll)); v == "0" {
		longPoll = -1
	} else if v != "" {
		ms, err := envInt(envLongPoll, 0)
		if err != nil {
			return client.MDSOptions{}, err
		}
		longPoll = time.Duration(ms) * time.Millisecond
	}
	tlsCfg, token, err := securityEnv()
	if err != nil {
		return client.MDSOptions{}, err
	}
	// DFKV_CLIENT_REGISTER=0 is the operator's opt-out, whatever the caller's flags say.
	register := o.Flags&FlagRegisterWithMDS != 0 && os.Getenv(envRegister) != "0"
	return client.MDSOptions{
		TLS: tlsCfg, Token: token,
		Endpoints: eps, Group: o.MDSGroup,
		Poll: time.Duration(o.MDSPollMS) * time.Millisecond, LongPoll: longPoll,
		ShrinkPolls: shrink, CallTimeout: time.Duration(timeoutMS) * time.Millisecond,
		Register: register, ClientID: o.ClientID, Info: info,
		Heartbeat: time.Duration(o.ClientHeartbeatMS) * time.Millisecond,
		Logger:    mdsLogger(), RingPointsPerWeight: points,
	}, nil
}
