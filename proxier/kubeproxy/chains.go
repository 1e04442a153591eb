package kubeproxy

import (
	"fmt"
	"slices"
	"strings"
)

// TableName is the name of kube-proxy's nftables table, in the ip and ip6
// families.
const TableName = "kube-proxy"

// chains are kube-proxy's fixed iptables chain names (iptables and ipvs
// modes), chainPrefixes those of its per-service and per-endpoint chains.
var (
	chains = []string{
		"KUBE-SERVICES", "KUBE-EXTERNAL-SERVICES", "KUBE-NODEPORTS", "KUBE-POSTROUTING",
		"KUBE-MARK-MASQ", "KUBE-FORWARD", "KUBE-PROXY-FIREWALL", "KUBE-PROXY-CANARY",
		"KUBE-NODE-PORT", "KUBE-LOAD-BALANCER", "KUBE-LOOP-BACK", "KUBE-IPVS-FILTER",
		"KUBE-IPVS-OUT-FILTER", "KUBE-SOURCE-RANGES-FIREWALL",
	}
	chainPrefixes = []string{"KUBE-SVC-", "KUBE-SVL-", "KUBE-SEP-", "KUBE-FW-", "KUBE-EXT-", "KUBE-XLB-"}
)

// IsChain tells whether an iptables chain is kube-proxy's. Kubelet's
// KUBE-FIREWALL, KUBE-KUBELET-CANARY and KUBE-IPTABLES-HINT are not.
func IsChain(name string) bool {
	if slices.Contains(chains, name) {
		return true
	}
	for _, p := range chainPrefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// tables are the iptables tables kube-proxy writes to.
var tables = []string{"nat", "filter", "mangle"}

// Plan reads iptables-save output and returns the iptables-restore
// --noflush input that removes kube-proxy's chains from nat, filter and
// mangle, and the rules of other chains that jump (or go) to them; and the
// chains it removes, as "table/chain". Both are empty when there is nothing
// of kube-proxy's. Declaring a chain in restore input flushes it, so that
// the chains reference nothing when they are deleted, after the jumps.
func Plan(save string) (script string, removed []string, err error) {
	var b strings.Builder
	table := ""
	var kube, jumps []string
	for n, line := range strings.Split(save, "\n") {
		line = strings.TrimRight(line, "\r")
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "*"):
			table, kube, jumps = line[1:], nil, nil
		case line == "COMMIT":
			if len(kube) > 0 && slices.Contains(tables, table) {
				fmt.Fprintf(&b, "*%s\n", table)
				for _, c := range kube {
					fmt.Fprintf(&b, ":%s - [0:0]\n", c)
				}
				for _, j := range jumps {
					fmt.Fprintf(&b, "-D %s\n", j)
				}
				for _, c := range kube {
					fmt.Fprintf(&b, "-X %s\n", c)
					removed = append(removed, table+"/"+c)
				}
				b.WriteString("COMMIT\n")
			}
			table = ""
		case table == "":
			return "", nil, fmt.Errorf("parse iptables-save line %d: %q outside a table", n+1, line)
		case strings.HasPrefix(line, ":"):
			name, _, _ := strings.Cut(line[1:], " ")
			if IsChain(name) {
				kube = append(kube, name)
			}
		case strings.HasPrefix(line, "-A "):
			rule := line[len("-A "):]
			chain, _, _ := strings.Cut(rule, " ")
			target, err := ruleTarget(rule)
			if err != nil {
				return "", nil, fmt.Errorf("parse iptables-save line %d: %w", n+1, err)
			}
			// Rules in kube-proxy's chains go with them.
			if !IsChain(chain) && IsChain(target) {
				jumps = append(jumps, rule)
			}
		default:
			return "", nil, fmt.Errorf("parse iptables-save line %d: unexpected %q", n+1, line)
		}
	}
	if table != "" {
		return "", nil, fmt.Errorf("parse iptables-save: table %s has no COMMIT", table)
	}
	return b.String(), removed, nil
}

// ruleTarget returns the chain a rule (iptables-save's arguments after -A)
// jumps or goes to, "" when none. Quoted arguments (comments) are skipped
// as iptables-save quotes them: in double quotes, with \" and \\ escaped.
func ruleTarget(rule string) (string, error) {
	args, err := splitArgs(rule)
	if err != nil {
		return "", err
	}
	for i := 0; i+1 < len(args); i++ {
		switch args[i] {
		case "-j", "--jump", "-g", "--goto":
			return args[i+1], nil
		}
	}
	return "", nil
}

func splitArgs(s string) ([]string, error) {
	var out []string
	var cur strings.Builder
	inArg, quoted := false, false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case quoted && c == '\\' && i+1 < len(s):
			i++
			cur.WriteByte(s[i])
		case c == '"':
			quoted, inArg = !quoted, true
		case !quoted && (c == ' ' || c == '\t'):
			if inArg {
				out = append(out, cur.String())
				cur.Reset()
				inArg = false
			}
		default:
			cur.WriteByte(c)
			inArg = true
		}
	}
	if quoted {
		return nil, fmt.Errorf("unterminated quote in %q", s)
	}
	if inArg {
		out = append(out, cur.String())
	}
	return out, nil
}
