// Package unpack applies OCI image layer tar streams, bottom-up, onto a
// directory opened as an [os.Root].
//
// The unpacker never writes outside the unpack root: every path operation
// goes through the root, and entries that name or lead outside it are
// refused with [ErrUnsafeLayer].
package unpack
