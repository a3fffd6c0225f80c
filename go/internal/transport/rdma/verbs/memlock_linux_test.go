package verbs

import (
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// Memlock reads the calling thread's capabilities (they are per thread): dropping
// CAP_IPC_LOCK from this thread's effective set shows, and restoring it shows again.
func TestMemlockSeesThisThreadsCapability(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var caps [2]unix.CapUserData
	if err := unix.Capget(&hdr, &caps[0]); err != nil {
		t.Fatal(err)
	}
	const ipcLock = 1 << unix.CAP_IPC_LOCK
	if caps[0].Effective&ipcLock == 0 {
		if Memlock().CapIPCLock {
			t.Fatal("CAP_IPC_LOCK reported without it")
		}
		t.Skip("this thread has no CAP_IPC_LOCK to drop")
	}
	if !Memlock().CapIPCLock {
		t.Fatal("CAP_IPC_LOCK not reported")
	}
	saved := caps
	caps[0].Effective &^= ipcLock
	if err := unix.Capset(&hdr, &caps[0]); err != nil {
		t.Fatal(err)
	}
	dropped := Memlock().CapIPCLock
	if err := unix.Capset(&hdr, &saved[0]); err != nil {
		t.Fatal(err)
	}
	if dropped {
		t.Fatal("CAP_IPC_LOCK still reported after this thread dropped it")
	}
	if !Memlock().CapIPCLock {
		t.Fatal("CAP_IPC_LOCK not reported after restoring it")
	}
}
