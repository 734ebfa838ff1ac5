// Package bpf holds Coordino's eBPF C sources and the Go bindings bpf2go
// generates from them (committed, so building needs no clang). The loader
// that pins maps and attaches programs is daemon/datapath.
//
// The objects built without the ClusterNetworkPolicy tiers (CDO_NO_TIERS,
// for kernels before 6.6) have the programs and maps of their tiered
// builds, so they get no bindings of their own: only their objects are
// generated (hack/bpf-object.sh), and notiers.go loads them into the
// tiered builds' types.
package bpf

//go:generate go tool bpf2go -tags linux -go-package bpf -output-stem coordino -cc clang -cflags "-O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu" -type endpoint_info -type ipcache_key -type ipcache_value -type policy_key -type policy_value -type ct_key -type ct_entry -type ct_stat -type ep_addr_key -type config -type counter -type flow_event -type nodeiso_config -type nodeiso_flag -type local_ep_key -type local_ep -type hostroute_stat -type tunnel_config -type tunnel_peer -type svc_nodeport_key -type reason -type direction -target bpfel Coordino coordino.c
//go:generate ../hack/bpf-object.sh coordino_notiers -tags linux -go-package bpf -cc clang -cflags "-DCDO_NO_TIERS -O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu" -target bpfel CoordinoNotiers coordino.c
//go:generate go tool bpf2go -tags linux -go-package bpf -output-stem coordino_svc -cc clang -cflags "-O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu" -target bpfel CoordinoSvc coordino_svc.c
//go:generate go tool bpf2go -tags linux -go-package bpf -output-stem coordino_count -cc clang -cflags "-O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu" -type map_count -target bpfel CoordinoCount coordino_count.c
//go:generate go tool bpf2go -tags linux -go-package bpf -output-stem coordino_svcmatch -cc clang -cflags "-O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu" -target bpfel CoordinoSvcmatch coordino_svcmatch.c
//go:generate ../hack/bpf-object.sh coordino_svcmatch_notiers -tags linux -go-package bpf -cc clang -cflags "-DCDO_NO_TIERS -O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu" -target bpfel CoordinoSvcmatchNotiers coordino_svcmatch.c
//go:generate go tool bpf2go -tags linux -go-package bpf -output-stem coordino_probe -cc clang -cflags "-O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu" -target bpfel CoordinoProbe coordino_probe.c
