package apiserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdv1 "k8s.io/client-go/tools/clientcmd/api/v1"
	"sigs.k8s.io/yaml"
)

// Version is the Kubernetes release build.sh builds and Start runs.
const Version = "v1.36.3"

// BinDirEnv names the environment variable that overrides where the binaries are.
const BinDirEnv = "NFTPROXY_K8S_BIN"

// ErrNotBuilt reports that etcd or kube-apiserver is not in the binary directory.
var ErrNotBuilt = errors.New("kubernetes binaries not built")

// Names of the binaries build.sh produces.
const (
	etcdBin              = "etcd"
	apiserverBin         = "kube-apiserver"
	controllerManagerBin = "kube-controller-manager"
)

// ServiceClusterIPRange is the range kube-apiserver allocates ClusterIPs from.
const ServiceClusterIPRange = "10.96.0.0/16"

// Options tune Start. The zero value is what tests normally want.
type Options struct {
	// BinDir holds etcd, kube-apiserver and kube-controller-manager. Empty
	// means $NFTPROXY_K8S_BIN, else ~/.cache/nftproxy/k8s-v1.36.3.
	BinDir string
	// Dir receives certificates, etcd data, the kubeconfig and logs. Empty
	// means a new temporary directory that Stop removes.
	Dir string
	// APIServerFlags are appended to kube-apiserver's flags; a flag given
	// twice takes its last value, so these override the defaults (list
	// flags excepted: a second one appends).
	APIServerFlags []string
	// ServiceAccounts admits pods as a real cluster does, with their
	// service account's token mounted (the ServiceAccount admission plugin;
	// a controller manager must run to create the accounts). Off, pods are
	// admitted without one. A flag in APIServerFlags cannot do this: list
	// flags given twice append.
	ServiceAccounts bool
	// StartTimeout bounds how long each process may take to become ready.
	// Zero means 60 s.
	StartTimeout time.Duration
}

// Server is a running etcd and kube-apiserver on 127.0.0.1.
type Server struct {
	// RestConfig authenticates as an admin (group system:masters).
	RestConfig *rest.Config
	// Kubeconfig is the path of a kubeconfig file with the same credentials.
	Kubeconfig string
	// URL is kube-apiserver's address, https://127.0.0.1:PORT.
	URL string
	// EtcdURL is etcd's client address, http://127.0.0.1:PORT.
	EtcdURL string
	// Dir holds certificates, etcd data and the logs (etcd.log,
	// kube-apiserver.log, kube-controller-manager.log).
	Dir string

	binDir     string
	timeout    time.Duration
	removeDir  bool
	http       *http.Client
	apiArgs    []string
	keepLogs   bool
	mu         sync.Mutex
	etcd       *process
	apiserver  *process
	controller *process
	stopped    bool
}

// DefaultBinDir returns where build.sh puts the binaries: $NFTPROXY_K8S_BIN
// when set, else ~/.cache/nftproxy/k8s-v1.36.3.
func DefaultBinDir() string {
	if d := os.Getenv(BinDirEnv); d != "" {
		return d
	}
	home, err := os.UserHomeDir()
	if err != nil {
		home = os.TempDir()
	}
	return filepath.Join(home, ".cache", "nftproxy", "k8s-"+Version)
}

// Start runs etcd and then kube-apiserver, and returns once /readyz answers.
// ctx bounds the start only; the processes run until Stop.
func Start(ctx context.Context, opts Options) (_ *Server, err error) {
	binDir := opts.BinDir
	if binDir == "" {
		binDir = DefaultBinDir()
	}
	for _, b := range []string{etcdBin, apiserverBin} {
		if err := checkExecutable(filepath.Join(binDir, b)); err != nil {
			return nil, fmt.Errorf("find %s in %s: %w", b, binDir, ErrNotBuilt)
		}
	}

	s := &Server{binDir: binDir, timeout: opts.StartTimeout, Dir: opts.Dir}
	if s.timeout == 0 {
		s.timeout = 60 * time.Second
	}
	if s.Dir == "" {
		removeStaleDirs()
		if s.Dir, err = os.MkdirTemp("", dirPrefix+strconv.Itoa(os.Getpid())+"-"); err != nil {
			return nil, fmt.Errorf("create server directory: %w", err)
		}
		s.removeDir = true
	}
	defer func() {
		if err != nil {
			// The error names log files; leave them for the reader.
			s.KeepLogs()
			s.Stop()
		}
	}()

	p, err := newPKI(time.Now())
	if err != nil {
		return nil, err
	}
	if err := p.write(s.Dir); err != nil {
		return nil, fmt.Errorf("write certificates: %w", err)
	}
	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	s.EtcdURL = "http://127.0.0.1:" + strconv.Itoa(ports[0])
	peerURL := "http://127.0.0.1:" + strconv.Itoa(ports[1])
	s.URL = "https://127.0.0.1:" + strconv.Itoa(ports[2])

	s.RestConfig = &rest.Config{
		Host: s.URL,
		TLSClientConfig: rest.TLSClientConfig{
			CAData:   p.caCert,
			CertData: p.adminCert,
			KeyData:  p.adminKey,
		},
		// Tests create objects in bursts; client-go's default 5 QPS would dominate their run time.
		QPS:       200,
		Burst:     400,
		UserAgent: "nftproxy-e2e",
	}
	if s.http, err = rest.HTTPClientFor(s.RestConfig); err != nil {
		return nil, fmt.Errorf("make health-check client: %w", err)
	}
	s.Kubeconfig = filepath.Join(s.Dir, "kubeconfig")
	if err := writeKubeconfig(s.Kubeconfig, s.URL, p); err != nil {
		return nil, err
	}

	if err := s.startEtcd(ctx, peerURL); err != nil {
		return nil, err
	}
	s.apiArgs = append(s.apiserverArgs(ports[2], opts.ServiceAccounts), opts.APIServerFlags...)
	if err := s.StartAPIServer(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Server) startEtcd(ctx context.Context, peerURL string) error {
	args := []string{
		"--name=e2e",
		"--data-dir=" + filepath.Join(s.Dir, "etcd"),
		"--listen-client-urls=" + s.EtcdURL,
		"--advertise-client-urls=" + s.EtcdURL,
		"--listen-peer-urls=" + peerURL,
		"--initial-advertise-peer-urls=" + peerURL,
		"--initial-cluster=e2e=" + peerURL,
		"--initial-cluster-state=new",
		// The data is thrown away after the test; fsync only costs time.
		"--unsafe-no-fsync",
		"--log-level=warn",
	}
	p, err := startProcess(etcdBin, filepath.Join(s.binDir, etcdBin), filepath.Join(s.Dir, "etcd.log"), args)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.etcd = p
	s.mu.Unlock()
	return s.waitReady(ctx, p, http.DefaultClient, s.EtcdURL+"/health")
}

// apiserverArgs are the flags that bring kube-apiserver up quickly on loopback
// with client-certificate authentication and RBAC.
func (s *Server) apiserverArgs(port int, serviceAccounts bool) []string {
	f := func(name string) string { return filepath.Join(s.Dir, name) }
	args := []string{
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		"--etcd-servers=" + s.EtcdURL,
		"--client-ca-file=" + f(caCertFile),
		"--tls-cert-file=" + f(servingCertFile),
		"--tls-private-key-file=" + f(servingKeyFile),
		"--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + f(saPublicFile),
		"--service-account-signing-key-file=" + f(saPrivateFile),
		"--service-cluster-ip-range=" + ServiceClusterIPRange,
		// The default reconciler would give the kubernetes Service a loopback
		// endpoint, which EndpointSlice validation rejects.
		"--endpoint-reconciler-type=none",
		"--allow-privileged=true",
		"--enable-priority-and-fairness=false",
		"--profiling=false",
	}
	if !serviceAccounts {
		// No controller manager creates default service accounts, and pods
		// (and the DaemonSet's privileged container) must still be admitted.
		args = append(args, "--disable-admission-plugins=ServiceAccount")
	}
	return args
}

// StartAPIServer starts kube-apiserver on its port against the running etcd
// and waits for /readyz. Start calls it; tests call it after StopAPIServer.
func (s *Server) StartAPIServer(ctx context.Context) error {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return errors.New("start kube-apiserver: server stopped")
	}
	if s.apiserver != nil {
		if done, _ := s.apiserver.exited(); !done {
			s.mu.Unlock()
			return errors.New("start kube-apiserver: already running")
		}
	}
	p, err := startProcess(apiserverBin, filepath.Join(s.binDir, apiserverBin), filepath.Join(s.Dir, "kube-apiserver.log"), s.apiArgs)
	if err != nil {
		s.mu.Unlock()
		return err
	}
	s.apiserver = p
	s.mu.Unlock()
	return s.waitReady(ctx, p, s.http, s.URL+"/readyz")
}

// StopAPIServer stops kube-apiserver (SIGTERM, SIGKILL after 5 s) and leaves
// etcd running, so StartAPIServer brings the same cluster back.
func (s *Server) StopAPIServer() {
	s.mu.Lock()
	p := s.apiserver
	s.mu.Unlock()
	if p != nil {
		p.stop(5 * time.Second)
	}
}

// PauseAPIServer freezes kube-apiserver with SIGSTOP: connections stay open
// and requests hang, as with a partitioned control plane, rather than being
// refused as after StopAPIServer. It returns once every thread has stopped:
// on a busy machine a thread not yet reached could still answer a request.
func (s *Server) PauseAPIServer() error {
	p, err := s.signalAPIServer(syscall.SIGSTOP)
	if err != nil {
		return err
	}
	return p.waitStopped(5 * time.Second)
}

// ResumeAPIServer lets a paused kube-apiserver run again.
func (s *Server) ResumeAPIServer() error {
	_, err := s.signalAPIServer(syscall.SIGCONT)
	return err
}

// signalAPIServer delivers sig to kube-apiserver and returns its process.
func (s *Server) signalAPIServer(sig syscall.Signal) (*process, error) {
	s.mu.Lock()
	p := s.apiserver
	s.mu.Unlock()
	if p == nil {
		return nil, errors.New("signal kube-apiserver: not started")
	}
	return p, p.signal(sig)
}

// StartControllerManager runs kube-controller-manager with only the named
// controllers (for example "endpointslice-controller") and waits for its
// /healthz. It needs the kube-controller-manager binary from build.sh.
func (s *Server) StartControllerManager(ctx context.Context, controllers ...string) error {
	if len(controllers) == 0 {
		return errors.New("start kube-controller-manager: no controllers named")
	}
	bin := filepath.Join(s.binDir, controllerManagerBin)
	if err := checkExecutable(bin); err != nil {
		return fmt.Errorf("find %s in %s: %w", controllerManagerBin, s.binDir, ErrNotBuilt)
	}
	ports, err := freePorts(1)
	if err != nil {
		return err
	}
	f := func(name string) string { return filepath.Join(s.Dir, name) }
	args := []string{
		"--kubeconfig=" + s.Kubeconfig,
		"--authentication-kubeconfig=" + s.Kubeconfig,
		"--authorization-kubeconfig=" + s.Kubeconfig,
		"--controllers=" + strings.Join(controllers, ","),
		"--leader-elect=false",
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(ports[0]),
		// The apiserver's certificate names 127.0.0.1, so health checks can verify it.
		"--tls-cert-file=" + f(servingCertFile),
		"--tls-private-key-file=" + f(servingKeyFile),
		"--root-ca-file=" + f(caCertFile),
		"--service-account-private-key-file=" + f(saPrivateFile),
		"--service-cluster-ip-range=" + ServiceClusterIPRange,
		"--profiling=false",
	}

	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return errors.New("start kube-controller-manager: server stopped")
	}
	if s.controller != nil {
		if done, _ := s.controller.exited(); !done {
			s.mu.Unlock()
			return errors.New("start kube-controller-manager: already running")
		}
	}
	p, err := startProcess(controllerManagerBin, bin, f("kube-controller-manager.log"), args)
	if err != nil {
		s.mu.Unlock()
		return err
	}
	s.controller = p
	s.mu.Unlock()
	return s.waitReady(ctx, p, s.http, "https://127.0.0.1:"+strconv.Itoa(ports[0])+"/healthz")
}

// StopControllerManager stops kube-controller-manager if it runs.
func (s *Server) StopControllerManager() {
	s.mu.Lock()
	p := s.controller
	s.mu.Unlock()
	if p != nil {
		p.stop(5 * time.Second)
	}
}

// KeepLogs makes Stop leave the log files in Dir (etcd's data is still removed),
// so a failed test can point at them.
func (s *Server) KeepLogs() {
	s.mu.Lock()
	s.keepLogs = true
	s.mu.Unlock()
}

// Stop ends every process and removes the directory Start created. It is safe
// to call more than once.
func (s *Server) Stop() {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return
	}
	s.stopped = true
	procs := []*process{s.controller, s.apiserver, s.etcd}
	s.mu.Unlock()

	for _, p := range procs {
		if p != nil {
			p.stop(5 * time.Second)
		}
	}
	if !s.removeDir {
		return
	}
	if s.keepLogs {
		_ = os.RemoveAll(filepath.Join(s.Dir, "etcd"))
		return
	}
	_ = os.RemoveAll(s.Dir)
}

// waitReady polls url until it answers 200, the process exits, or the start
// timeout passes; failures carry the tail of the process's log.
func (s *Server) waitReady(ctx context.Context, p *process, client *http.Client, url string) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		if done, err := p.exited(); done {
			return fmt.Errorf("wait for %s: %w; log %s ends with:\n%s", p.name, err, p.logPath, p.tail())
		}
		if last = probe(ctx, client, url); last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for %s at %s: %w (last probe: %v); log %s ends with:\n%s",
				p.name, url, ctx.Err(), last, p.logPath, p.tail())
		case <-tick.C:
		}
	}
}

func probe(ctx context.Context, client *http.Client, url string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %s", resp.Status)
	}
	return nil
}

// dirPrefix starts the name of every directory Start creates; the owner's
// PID follows, so removeStaleDirs can tell which owners are gone.
const dirPrefix = "nftproxy-apiserver-"

// removeStaleDirs deletes directories left by test processes that died
// before Stop (etcd preallocates over 100 MB in each). A directory whose PID
// is alive is kept even if the PID was reused: leaking is safer than removing
// a running server's data.
func removeStaleDirs() {
	matches, _ := filepath.Glob(filepath.Join(os.TempDir(), dirPrefix+"*"))
	for _, dir := range matches {
		pidStr, _, ok := strings.Cut(strings.TrimPrefix(filepath.Base(dir), dirPrefix), "-")
		pid, err := strconv.Atoi(pidStr)
		if !ok || err != nil || pid <= 0 {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			_ = os.RemoveAll(dir)
		}
	}
}

// freePorts reserves n distinct loopback ports by binding them at once, then
// releases them for the processes to take.
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("pick free port: %w", err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func checkExecutable(path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	if st.IsDir() || st.Mode().Perm()&0o111 == 0 {
		return fmt.Errorf("%s is not an executable file", path)
	}
	return nil
}

// writeKubeconfig writes a kubeconfig with the admin credentials embedded, so
// it stays valid wherever it is copied.
func writeKubeconfig(path, url string, p *pki) error {
	cfg := clientcmdv1.Config{
		APIVersion:     "v1",
		Kind:           "Config",
		CurrentContext: "nftproxy-e2e",
		Clusters: []clientcmdv1.NamedCluster{{
			Name:    "nftproxy-e2e",
			Cluster: clientcmdv1.Cluster{Server: url, CertificateAuthorityData: p.caCert},
		}},
		AuthInfos: []clientcmdv1.NamedAuthInfo{{
			Name:     "admin",
			AuthInfo: clientcmdv1.AuthInfo{ClientCertificateData: p.adminCert, ClientKeyData: p.adminKey},
		}},
		Contexts: []clientcmdv1.NamedContext{{
			Name:    "nftproxy-e2e",
			Context: clientcmdv1.Context{Cluster: "nftproxy-e2e", AuthInfo: "admin"},
		}},
	}
	data, err := yaml.Marshal(cfg)
	if err != nil {
		return fmt.Errorf("encode kubeconfig: %w", err)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		return fmt.Errorf("write kubeconfig: %w", err)
	}
	return nil
}

// RelayedKubeconfig writes to path a copy of the kubeconfig admin whose
// server is server (a relay's address; the serving certificate is checked
// for 127.0.0.1, where the API server really listens) and which, when
// identity is set, acts as that user by impersonation.
func RelayedKubeconfig(admin, server, identity, path string) error {
	cfg, err := clientcmd.LoadFromFile(admin)
	if err != nil {
		return fmt.Errorf("load kubeconfig: %w", err)
	}
	for _, c := range cfg.Clusters {
		c.Server = "https://" + server
		c.TLSServerName = "127.0.0.1"
	}
	if identity != "" {
		for _, a := range cfg.AuthInfos {
			a.Impersonate = identity
		}
	}
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return fmt.Errorf("write kubeconfig: %w", err)
	}
	return nil
}

// DeleteServicesAndSlices deletes every Service and EndpointSlice of a
// Kubernetes namespace. Without a namespace controller a namespace itself
// never goes away, so tests clear what they made in it instead.
func DeleteServicesAndSlices(ctx context.Context, client kubernetes.Interface, ns string) error {
	svcs, err := client.CoreV1().Services(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list services: %w", err)
	}
	var errs []error
	for _, s := range svcs.Items {
		if err := client.CoreV1().Services(ns).Delete(ctx, s.Name, metav1.DeleteOptions{}); err != nil {
			errs = append(errs, fmt.Errorf("delete service %s: %w", s.Name, err))
		}
	}
	if err := client.DiscoveryV1().EndpointSlices(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		errs = append(errs, fmt.Errorf("delete endpoint slices: %w", err))
	}
	return errors.Join(errs...)
}
