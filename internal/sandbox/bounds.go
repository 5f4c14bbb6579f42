package sandbox

// maxEndedOutput bounds the output a sandbox keeps of its ended
// processes, all together: past it the oldest ended go from its list
// (trimLocked), as past maxProcesses. Each process keeps at most
// Options.OutputBytes, so without it a sandbox's host memory would grow
// to maxProcesses times that.
const maxEndedOutput = 16 << 20

// endedOutput is the output bytes p keeps if it has ended, else 0
// (those of a running process are bounded by its own cap).
func (p *Process) endedOutput() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.exit == nil {
		return 0
	}
	return p.kept
}
