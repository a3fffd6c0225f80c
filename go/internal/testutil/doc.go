// Package testutil holds the helpers that several packages' tests share: waiting, with a
// bound, for a condition another goroutine or process makes true; and frames crafted to
// catch a decoder reading past the end of its input.
package testutil
