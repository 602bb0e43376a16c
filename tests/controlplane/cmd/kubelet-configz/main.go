// Command kubelet-configz serves a kubelet's /configz over HTTPS, built as the kubelet builds it:
// a v1beta1 KubeletConfiguration defaulted by the kubelet's own scheme, converted to the internal
// type and back (cmd/kubelet/app/server.go, convertToVersionedKubeletConfig and setConfigz), and
// served by k8s.io/component-base/configz. No kubelet runs in the tests (it needs a container
// runtime, cgroups and root); this is the one kubelet endpoint they read, through the apiserver's
// node proxy.
//
//	kubelet-configz --listen 127.0.0.1:PORT [--node-status-max-images N]
package main

import (
	"crypto/tls"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"

	"k8s.io/client-go/util/cert"
	"k8s.io/component-base/configz"
	kubeletconfigv1beta1 "k8s.io/kubelet/config/v1beta1"
	kubeletconfig "k8s.io/kubernetes/pkg/kubelet/apis/config"
	kubeletscheme "k8s.io/kubernetes/pkg/kubelet/apis/config/scheme"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to serve HTTPS on")
	maxImages := flag.Int("node-status-max-images", -2, "nodeStatusMaxImages (-2: leave it to the kubelet's default)")
	flag.Parse()
	if err := run(*listen, *maxImages); err != nil {
		fmt.Fprintln(os.Stderr, "kubelet-configz:", err)
		os.Exit(1)
	}
}

func run(listen string, maxImages int) error {
	scheme, _, err := kubeletscheme.NewSchemeAndCodecs()
	if err != nil {
		return err
	}
	given := &kubeletconfigv1beta1.KubeletConfiguration{}
	if maxImages != -2 {
		value := int32(maxImages)
		given.NodeStatusMaxImages = &value
	}
	scheme.Default(given)
	internal := &kubeletconfig.KubeletConfiguration{}
	if err := scheme.Convert(given, internal, nil); err != nil {
		return err
	}
	versioned := &kubeletconfigv1beta1.KubeletConfiguration{}
	if err := scheme.Convert(internal, versioned, nil); err != nil {
		return err
	}
	versioned.GetObjectKind().SetGroupVersionKind(kubeletconfigv1beta1.SchemeGroupVersion.WithKind("KubeletConfiguration"))
	cz, err := configz.New("kubeletconfig")
	if err != nil {
		return err
	}
	if err := cz.Set(versioned); err != nil {
		return err
	}
	mux := http.NewServeMux()
	configz.InstallHandler(mux)

	certPEM, keyPEM, err := cert.GenerateSelfSignedCertKey("kubelet", []net.IP{net.ParseIP("127.0.0.1")}, nil)
	if err != nil {
		return err
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return err
	}
	listener, err := tls.Listen("tcp", listen, &tls.Config{Certificates: []tls.Certificate{pair}})
	if err != nil {
		return err
	}
	fmt.Println(listener.Addr().String()) // the tests read the port from here
	return http.Serve(listener, mux)
}
