package conformance

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/nftproxy/nftproxy/e2e/netns"
)

// egressProxy is kube-apiserver's way into the cluster's network: the API
// server runs on the host's loopback, the kubelets and pods live behind the
// fabric namespace, and nothing routes between the two. kube-apiserver's
// egress selector sends every connection to a kubelet, pod or service
// (exec, logs, port-forward, the proxy subresources) as an HTTP CONNECT to
// this unix socket, and the proxy dials it from inside the fabric.
type egressProxy struct {
	l    net.Listener
	from *netns.NS
	wg   sync.WaitGroup
}

func startEgressProxy(socket string, from *netns.NS) (*egressProxy, error) {
	l, err := net.Listen("unix", socket)
	if err != nil {
		return nil, err
	}
	p := &egressProxy{l: l, from: from}
	p.wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go p.serve(c)
		}
	})
	return p, nil
}

func (p *egressProxy) serve(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	req, err := http.ReadRequest(br)
	if err != nil || req.Method != http.MethodConnect {
		io.WriteString(c, "HTTP/1.1 400 Bad Request\r\n\r\n")
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	up, err := p.from.Dial(ctx, "tcp", req.Host)
	cancel()
	if err != nil {
		io.WriteString(c, "HTTP/1.1 502 Bad Gateway\r\n\r\n"+err.Error())
		return
	}
	defer up.Close()
	if _, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	done := make(chan struct{}, 2)
	go func() { io.Copy(up, br); closeWrite(up); done <- struct{}{} }()
	go func() { io.Copy(c, up); closeWrite(c); done <- struct{}{} }()
	<-done
	<-done
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
}

// Close stops accepting; connections in flight end with their peers, which
// are all stopped by then.
func (p *egressProxy) Close() {
	p.l.Close()
	p.wg.Wait()
}

// egressConfig is kube-apiserver's EgressSelectorConfiguration sending the
// cluster's traffic through the proxy at socket.
func egressConfig(socket string) string {
	return `apiVersion: apiserver.k8s.io/v1beta1
kind: EgressSelectorConfiguration
egressSelections:
- name: cluster
  connection:
    proxyProtocol: HTTPConnect
    transport:
      uds:
        udsName: ` + socket + "\n"
}
