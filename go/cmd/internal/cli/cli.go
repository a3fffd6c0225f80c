// Package cli holds the small pieces every dfkv binary's command line shares: environment
// twins for flags (--cap ↔ DFKV_CAP), byte-size flags ("64MiB"), and logger setup.
package cli

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"

	"github.com/dfkv/dfkv/go/internal/version"
)

// EnvName returns the environment twin of a flag: --store-engine → DFKV_STORE_ENGINE.
func EnvName(flagName string) string {
	return "DFKV_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// ApplyEnv sets every flag not given on the command line from its DFKV_* twin. Command-line
// values win over the environment; the environment wins over defaults.
func ApplyEnv(fs *flag.FlagSet) error {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] || err != nil {
			return
		}
		if v, ok := os.LookupEnv(EnvName(f.Name)); ok {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("%s=%q: %w", EnvName(f.Name), v, e)
			}
		}
	})
	return err
}

// Size is a byte count flag accepting plain numbers and KiB/MiB/GiB/TiB (or K/M/G/T,
// KB/MB/GB/TB as powers of 1000).
type Size int64

func (s *Size) String() string { return strconv.FormatInt(int64(*s), 10) }

// Set parses a size.
func (s *Size) Set(v string) error {
	n, err := ParseSize(v)
	if err != nil {
		return err
	}
	*s = Size(n)
	return nil
}

// ParseSize parses "1048576", "1MiB", "1.5GiB", "10GB".
func ParseSize(v string) (int64, error) {
	v = strings.TrimSpace(v)
	units := []struct {
		suffix string
		mult   float64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10},
		{"TB", 1e12}, {"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3},
		{"T", 1 << 40}, {"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}, {"B", 1}}
	mult := 1.0
	for _, u := range units {
		if strings.HasSuffix(v, u.suffix) {
			mult, v = u.mult, strings.TrimSpace(strings.TrimSuffix(v, u.suffix))
			break
		}
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f < 0 || f*mult > 1<<62 {
		return 0, fmt.Errorf("bad size %q", v)
	}
	return int64(f * mult), nil
}

// Logger returns a text slog logger at the named level.
func Logger(level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("bad log level %q", level)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: l})), nil
}

// ParseFailed reports a command-line error the way every dfkv daemon does: --help exits 0,
// anything else is printed and exits 2.
func ParseFailed(name string, err error) int {
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
	return 2
}

// RunDaemon is the rest of a daemon's lifecycle after its flags parsed: --version, logger
// setup (a bad level exits 2), then serve; a serve error is logged and exits 1.
func RunDaemon(name string, showVersion bool, logLevel string, serve func(*slog.Logger, *Stop) error) int {
	if showVersion {
		fmt.Println(name, version.Version)
		return 0
	}
	log, err := Logger(logLevel)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		return 2
	}
	stop := CatchStop(log)
	defer stop.Release()
	if err := serve(log, stop); err != nil {
		log.Error(name+" failed", "err", err)
		return 1
	}
	return 0
}
