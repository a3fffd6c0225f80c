package notify

import (
	"context"
	"errors"
	"fmt"
)

// Sender picks the path of one connection's notifications: the native endpoint when the
// peer has one and the message fits, else the out-of-band (bootstrap TCP) path, but only
// when AllowFallback is set. A native send that failed for any other reason (backpressure,
// a broken QP, an uncertain send) is returned as is: never replayed over TCP.
type Sender struct {
	EP            *Endpoint // nil: the peer has no native notifications
	Fallback      func(name string, body []byte) error
	AllowFallback bool
	M             *Metrics
}

// Send sends one notification; nil means native local submission or a completed TCP write.
func (s *Sender) Send(ctx context.Context, name string, body []byte) error {
	if err := checkName(name); err != nil {
		return err
	}
	why := ErrUnsupported
	if s.EP != nil {
		err := s.EP.Send(ctx, name, body)
		if !errors.Is(err, ErrTooLarge) {
			return err
		}
		why = err
	}
	if !s.AllowFallback || s.Fallback == nil {
		return fmt.Errorf("notify: no out-of-band fallback: %w", why)
	}
	if err := s.Fallback(name, body); err != nil {
		return fmt.Errorf("notify: out-of-band send: %w", err)
	}
	if s.M != nil {
		s.M.Fallbacks.Add(1)
	}
	return nil
}
