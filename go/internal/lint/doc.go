// Package lint holds source checks over the repository's Go code that go vet does not
// make: library packages read no environment variables (the binaries and the C ABI turn
// the environment into options), and fmt.Errorf keeps the cause of an error it formats
// (%w, not %v or %s). The checks are plain go/ast scans run by go test; each is also run
// on a small source with known faults, so a check that stops finding them fails.
package lint
