// Command freeport prints a free TCP port for a server to listen on, below the kernel's range
// of ephemeral ports (a fallback for lib.sh's free_port where python3 is missing).
package main

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

func main() {
	low := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 0 {
			if n, err := strconv.Atoi(f[0]); err == nil && n > 10001 {
				low = n
			}
		}
	}
	for range 1000 {
		port := 10000 + rand.IntN(low-10000)
		l, err := net.Listen("tcp", fmt.Sprintf("0.0.0.0:%d", port))
		if err != nil {
			continue
		}
		l.Close()
		fmt.Println(port)
		return
	}
	fmt.Fprintln(os.Stderr, "no free port below the ephemeral range")
	os.Exit(1)
}
