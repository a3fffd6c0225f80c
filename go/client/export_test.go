package client

// SetSGLaneOff routes multi-SGE requests through the scalar pool (the behaviour before the
// SG lane) until restore is called: the SG lane test shows its per-QP series then catch the
// overlap the lane prevents.
func SetSGLaneOff(off bool) (restore func()) {
	old := sgLaneOff.Swap(off)
	return func() { sgLaneOff.Store(old) }
}
