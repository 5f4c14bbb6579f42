// Package task parses a task.json strictly and resolves it against the config into a validated Plan that a backend can run.
package task
