package client

import "github.com/dfkv/dfkv/go/internal/transport/rdma/railset"

// SetSGLaneOff routes multi-SGE requests through the scalar pool (the behaviour before the
// SG lane) until restore is called: the SG lane test shows its per-QP series then catch the
// overlap the lane prevents.
func SetSGLaneOff(off bool) (restore func()) { return railset.SetSGLaneOff(off) }
