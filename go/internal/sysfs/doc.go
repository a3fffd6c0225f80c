// Package sysfs reads the single-integer files the kernel publishes under /proc/sys and
// /sys (socket buffer maxima, the transparent huge page size), for tuning decisions made
// once per process.
package sysfs
