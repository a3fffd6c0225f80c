//go:build linux

package slab

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/dfkv/dfkv/go/internal/vfs"
)

const (
	metaName    = "slab.meta"
	metaFormat  = "dfkv-slab"
	metaVersion = 1
)

// meta is the persisted superblock. Geometry fields must match the configuration on every
// Open; Epoch and Clean implement the dirty-epoch marker.
type meta struct {
	Format        string  `json:"format"`
	Version       int     `json:"version"`
	ExtentBytes   int64   `json:"extent_bytes"`
	ExtentCount   int     `json:"extent_count"`
	MaxValueBytes int64   `json:"max_value_bytes"`
	RecordBytes   int     `json:"record_bytes"`
	Classes       []int64 `json:"classes"`
	// Epoch is bumped at every Open and stamped into the records written during it.
	Epoch uint32 `json:"epoch"`
	// Clean is false while an engine has the directory open; true after a clean Close.
	Clean bool `json:"clean"`
}

func geometryOf(c Config) meta {
	return meta{
		Format:        metaFormat,
		Version:       metaVersion,
		ExtentBytes:   c.ExtentBytes,
		ExtentCount:   c.extentCount(),
		MaxValueBytes: c.MaxValueBytes,
		RecordBytes:   recordSize,
		Classes:       sizeClasses(c.MaxValueBytes),
	}
}

// geometryDiff describes how on-disk geometry differs from the wanted one ("" if equal).
func geometryDiff(disk, want meta) string {
	var d []string
	if disk.Format != want.Format || disk.Version != want.Version {
		d = append(d, fmt.Sprintf("format %s v%d, want %s v%d", disk.Format, disk.Version, want.Format, want.Version))
	}
	if disk.ExtentBytes != want.ExtentBytes {
		d = append(d, fmt.Sprintf("extent size %d on disk, %d configured", disk.ExtentBytes, want.ExtentBytes))
	}
	if disk.ExtentCount != want.ExtentCount {
		d = append(d, fmt.Sprintf("extent count %d on disk (capacity %d), %d configured (capacity %d)",
			disk.ExtentCount, int64(disk.ExtentCount)*disk.ExtentBytes, want.ExtentCount, int64(want.ExtentCount)*want.ExtentBytes))
	}
	if disk.MaxValueBytes != want.MaxValueBytes {
		d = append(d, fmt.Sprintf("max value size %d on disk, %d configured", disk.MaxValueBytes, want.MaxValueBytes))
	}
	if disk.RecordBytes != want.RecordBytes {
		d = append(d, fmt.Sprintf("record size %d on disk, %d expected", disk.RecordBytes, want.RecordBytes))
	}
	if !slices.Equal(disk.Classes, want.Classes) {
		d = append(d, "size classes differ")
	}
	if len(d) == 0 {
		return ""
	}
	return fmt.Sprint(d)
}

// Formatted reports the extent size and largest value size dir was formatted with;
// ok is false when dir holds no slab superblock.
func Formatted(dir string) (extentBytes, maxValueBytes int64, ok bool, err error) {
	m, ok, err := readMeta(vfs.Default, dir)
	if err != nil || !ok {
		return 0, 0, ok, err
	}
	return m.ExtentBytes, m.MaxValueBytes, true, nil
}

// readMeta returns the superblock, or ok=false when the directory has never been formatted.
func readMeta(fs vfs.FS, dir string) (m meta, ok bool, err error) {
	raw, err := fs.ReadFile(filepath.Join(dir, metaName))
	if errors.Is(err, os.ErrNotExist) {
		return meta{}, false, nil
	}
	if err != nil {
		return meta{}, false, err
	}
	if err := json.Unmarshal(raw, &m); err != nil {
		return meta{}, false, fmt.Errorf("parse %s: %w", metaName, err)
	}
	return m, true, nil
}

// writeMeta replaces the superblock atomically and durably (temp file, fsync, rename,
// directory fsync), so a crash leaves either the old or the new version.
func writeMeta(fs vfs.FS, dir string, m meta) error {
	raw, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, metaName+".tmp")
	f, err := fs.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(append(raw, '\n')); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := fs.Rename(tmp, filepath.Join(dir, metaName)); err != nil {
		return err
	}
	return fs.SyncDir(dir)
}
