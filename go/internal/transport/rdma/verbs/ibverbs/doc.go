// Package ibverbs is the verbs seam over rdma-core's libibverbs, loaded at run time with
// dlopen (as NCCL does) so that one dfkv_server and one libdfkv.so run on machines with and
// without rdma-core. No rdma-core headers are needed to build either: verbs_abi.h declares
// the stable libibverbs ABI this package uses (checked against the real header by
// TestABILayout where it is installed); nothing links against libibverbs. Functions are
// resolved with dlsym; the data-path calls (post_send, post_recv, poll_cq, req_notify_cq)
// are inline wrappers, as in the header, which jump through the device context's ops
// table and so need no symbol. Each connection's source GID comes from the port's GID
// table (GIDTable: ibv_query_gid_table, else sysfs) through verbs.ChooseGID.
//
// Where the library or a device is missing, Devices returns one line saying why, wrapping
// verbs.ErrUnavailable (no usable libibverbs, or built without cgo) or verbs.ErrNoDevice
// (the library works but the kernel has no RDMA support or no device is present).
//
// Memory registered with this provider must not be Go heap memory (the NIC keeps the
// address): use verbs.AllocBuffer or other mmap'd memory.
package ibverbs
