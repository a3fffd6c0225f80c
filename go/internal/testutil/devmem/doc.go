// Package devmem is the e2e tests' stand-in for device (GPU) memory: one allocation a test
// registers with RegisterDMABuf and then reads and poisons through its own CPU mapping.
//
// New makes a real DMA-BUF where the kernel can: a udmabuf (a memfd sealed against
// shrinking, turned into a dma-buf by the UDMABUF_CREATE ioctl on /dev/udmabuf), which
// every provider can import as ibv_reg_dmabuf_mr would a GPU's. Without /dev/udmabuf (or
// over the module's size_limit_mb) it falls back to the memfd itself, which only the soft
// provider takes as a DMA-BUF (it maps the fd). Mem.Kind says which one a test got; New
// logs it. UDMABuf insists on a udmabuf. Linux only.
package devmem
