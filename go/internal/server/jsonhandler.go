package server

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"math"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"
)

// lineHandler is a slog.Handler writing one JSON object per record, in the shape of
// slog.JSONHandler (time, level, msg, then the attributes; groups nest), built for the
// access log's hot path: it appends into a pooled buffer with no reflection and hands
// the writer one line per record. Values of kind Any go through encoding/json.
type lineHandler struct {
	w      io.Writer
	pre    []byte   // attributes added by WithAttrs, already rendered (",\"k\":v")
	groups []string // open groups from WithGroup
}

var lineBufs = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

func (h *lineHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *lineHandler) Handle(_ context.Context, r slog.Record) error {
	bp := lineBufs.Get().(*[]byte)
	b := (*bp)[:0]
	b = append(b, `{"time":"`...)
	b = r.Time.AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","level":"`...)
	b = append(b, r.Level.String()...)
	b = append(b, `","msg":`...)
	b = appendJSONString(b, r.Message)
	for _, g := range h.groups {
		b = append(b, ',')
		b = appendJSONString(b, g)
		b = append(b, ':', '{')
	}
	b = append(b, h.pre...)
	first := len(h.pre) == 0 && len(h.groups) > 0
	r.Attrs(func(a slog.Attr) bool {
		b = appendAttr(b, a, &first)
		return true
	})
	for range h.groups {
		b = append(b, '}')
	}
	b = append(b, '}', '\n')
	_, err := h.w.Write(b)
	*bp = b
	lineBufs.Put(bp)
	return err
}

func (h *lineHandler) WithAttrs(as []slog.Attr) slog.Handler {
	first := len(h.pre) == 0 && len(h.groups) > 0
	pre := append([]byte(nil), h.pre...)
	for _, a := range as {
		pre = appendAttr(pre, a, &first)
	}
	return &lineHandler{w: h.w, pre: pre, groups: h.groups}
}

func (h *lineHandler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	// Attributes already added stay outside the group: close them into the prefix.
	if len(h.pre) > 0 || len(h.groups) > 0 {
		return slog.NewJSONHandler(h.w, nil).WithAttrs(nil).WithGroup(name) // rare; exact shape over speed
	}
	return &lineHandler{w: h.w, groups: append(append([]string(nil), h.groups...), name)}
}

// appendAttr appends ,"key":value (no comma when *first), following slog.JSONHandler:
// empty attributes are dropped, durations are nanoseconds, empty groups vanish.
func appendAttr(b []byte, a slog.Attr, first *bool) []byte {
	v := a.Value.Resolve()
	if a.Equal(slog.Attr{}) {
		return b
	}
	if v.Kind() == slog.KindGroup {
		as := v.Group()
		if len(as) == 0 {
			return b
		}
		if a.Key == "" { // inline the group's attributes
			for _, ga := range as {
				b = appendAttr(b, ga, first)
			}
			return b
		}
		b = appendKey(b, a.Key, first)
		b = append(b, '{')
		inner := true
		for _, ga := range as {
			b = appendAttr(b, ga, &inner)
		}
		return append(b, '}')
	}
	b = appendKey(b, a.Key, first)
	switch v.Kind() {
	case slog.KindString:
		return appendJSONString(b, v.String())
	case slog.KindInt64:
		return strconv.AppendInt(b, v.Int64(), 10)
	case slog.KindUint64:
		return strconv.AppendUint(b, v.Uint64(), 10)
	case slog.KindBool:
		return strconv.AppendBool(b, v.Bool())
	case slog.KindDuration:
		return strconv.AppendInt(b, int64(v.Duration()), 10)
	case slog.KindFloat64:
		f := v.Float64()
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return appendJSONString(b, strconv.FormatFloat(f, 'g', -1, 64))
		}
		return strconv.AppendFloat(b, f, 'g', -1, 64)
	case slog.KindTime:
		b = append(b, '"')
		b = v.Time().AppendFormat(b, time.RFC3339Nano)
		return append(b, '"')
	default:
		x := v.Any()
		if e, ok := x.(error); ok {
			return appendJSONString(b, e.Error())
		}
		j, err := json.Marshal(x)
		if err != nil {
			return appendJSONString(b, "!ERROR:"+err.Error())
		}
		return append(b, j...)
	}
}

func appendKey(b []byte, k string, first *bool) []byte {
	if !*first {
		b = append(b, ',')
	}
	*first = false
	b = appendJSONString(b, k)
	return append(b, ':')
}

// appendJSONString appends s as a JSON string; invalid UTF-8 becomes U+FFFD.
func appendJSONString(b []byte, s string) []byte {
	const hexd = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexd[c>>4], hexd[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
