//go:build !(cgo && seccomp)

package doctor

func seccompLibrary() (string, bool) {
	return "agentrun was built without seccomp support", false
}
