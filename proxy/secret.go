package proxy

// ReadSecret reads a secret as an injected header's value is read: from a
// regular file owned by root that no one else may read or write, of at
// most MaxSecretBytes, without its final line break. Errors name what is
// wrong with the file, never its content. The approval webhooks' signing
// keys are read with it.
func ReadSecret(file string) (string, error) { return readSecret(file) }
