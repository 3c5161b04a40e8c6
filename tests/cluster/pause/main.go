// pause: the process of a pod's sandbox container.  It holds the pod's
// namespaces open, reaps zombies (it is PID 1 when the pod shares its PID
// namespace) and exits cleanly on SIGINT/SIGTERM.  Written for the test
// cluster so that no pause image has to be pulled from a registry.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "-v" {
		os.Stdout.WriteString("pause (jupyter-sandbox test cluster)\n")
		return
	}
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sigs {
		switch s {
		case syscall.SIGCHLD:
			for {
				var ws syscall.WaitStatus
				pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
				if pid <= 0 || err != nil {
					break
				}
			}
		default:
			os.Exit(0)
		}
	}
}
