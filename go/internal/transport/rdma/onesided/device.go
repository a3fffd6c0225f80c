package onesided

// Device is the name of the device this server serves on.
func (s *Server) Device() string { return s.ctx.Info().Name }
