// dmabuf_probe: does this kernel's RDMA device accept a DMA-BUF memory region? It makes a
// udmabuf (a dma-buf over a sealed memfd: the stand-in for device memory) and registers it
// with ibv_reg_dmabuf_mr on the named device, printing the result and errno. Exit 0 when
// the registration succeeded, 1 when it was refused, 2 when the probe could not get that far.
//   dmabuf_probe DEVICE
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <linux/udmabuf.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

int main(int argc, char **argv) {
	const size_t size = 2 << 20;
	if (argc != 2) {
		fprintf(stderr, "usage: dmabuf_probe DEVICE\n");
		return 2;
	}
	int mfd = memfd_create("dfkv-dmabuf-probe", MFD_ALLOW_SEALING);
	if (mfd < 0 || ftruncate(mfd, size) != 0 || fcntl(mfd, F_ADD_SEALS, F_SEAL_SHRINK) != 0) {
		printf("dmabuf probe: memfd: %s (errno %d)\n", strerror(errno), errno);
		return 2;
	}
	int u = open("/dev/udmabuf", O_RDWR);
	if (u < 0) {
		printf("dmabuf probe: open /dev/udmabuf: %s (errno %d)\n", strerror(errno), errno);
		return 2;
	}
	struct udmabuf_create c = {.memfd = (unsigned)mfd, .flags = UDMABUF_FLAGS_CLOEXEC, .offset = 0, .size = size};
	int buf = ioctl(u, UDMABUF_CREATE, &c);
	if (buf < 0) {
		printf("dmabuf probe: UDMABUF_CREATE: %s (errno %d)\n", strerror(errno), errno);
		return 2;
	}
	int n = 0;
	struct ibv_device **l = ibv_get_device_list(&n);
	struct ibv_context *ctx = NULL;
	for (int i = 0; l && i < n; i++)
		if (strcmp(ibv_get_device_name(l[i]), argv[1]) == 0) ctx = ibv_open_device(l[i]);
	if (!ctx) {
		printf("dmabuf probe: cannot open device %s\n", argv[1]);
		return 2;
	}
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	if (!pd) {
		printf("dmabuf probe: ibv_alloc_pd: %s (errno %d)\n", strerror(errno), errno);
		return 2;
	}
	errno = 0;
	struct ibv_mr *mr = ibv_reg_dmabuf_mr(pd, 0, size, 0, buf,
	                                      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE);
	if (!mr) {
		int e = errno;
		printf("dmabuf probe: %s: ibv_reg_dmabuf_mr of a %zu-byte udmabuf refused: %s (errno %d)\n", argv[1], size, strerror(e), e);
		return 1;
	}
	printf("dmabuf probe: %s: ibv_reg_dmabuf_mr of a %zu-byte udmabuf accepted (lkey 0x%x rkey 0x%x)\n", argv[1], size, mr->lkey, mr->rkey);
	ibv_dereg_mr(mr);
	return 0;
}
