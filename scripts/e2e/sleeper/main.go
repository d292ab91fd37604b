// sleeper: the pause (sandbox) and test container image of the real-cluster tests.
// It waits for SIGTERM or SIGINT and exits 0; as PID 1 it also reaps orphans, as the
// upstream pause binary does. Static (CGO_ENABLED=0), no dependencies.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for sig := range sigs {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
