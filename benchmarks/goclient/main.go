// Command goclient is bench_extender.py's load client in Go (--client go): the serial per-pod chain
// kube-scheduler runs against a nodeCacheCapable extender (filter with node names, prioritize with the names
// that passed, the first host of the highest score, bind in a goroutine), over net/http as kube-scheduler's
// HTTPExtender does (one http.Client, HTTP/1.1 keep-alive, Go's default of 2 idle connections per host).
//
// The Python side prepares everything (pods created on the API stand-in, the extender caught up, the filter
// bodies encoded) and writes one job line per pod: {"PodName","PodNamespace","PodUID","Pod":{...},
// "Filter":{ExtenderArgs}}. This program reads them, prints "ready", waits for a line on stdin, runs the
// chain for every pod, waits for every bind, then prints one JSON line per pod and a summary line, and
// waits for stdin to close (so the caller can read its CPU time before it exits).
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// The wire types of k8s.io/kube-scheduler/extender/v1 (no json tags there: the field names are the keys).
type extenderArgs struct {
	Pod       json.RawMessage
	Nodes     *json.RawMessage // a *v1.NodeList there; always null with NodeNames (nodeCacheCapable)
	NodeNames *[]string
}

type extenderFilterResult struct {
	Nodes                      *json.RawMessage
	NodeNames                  *[]string
	FailedNodes                map[string]string
	FailedAndUnresolvableNodes map[string]string
	Error                      string
}

type hostPriority struct {
	Host  string
	Score int64
}

type extenderBindingArgs struct {
	PodName      string
	PodNamespace string
	PodUID       string
	Node         string
}

type extenderBindingResult struct {
	Error string
}

type job struct {
	PodName      string
	PodNamespace string
	PodUID       string
	Pod          json.RawMessage
	Filter       json.RawMessage
}

// podResult is one pod's line on stdout: seconds of each step, the names that passed, the host bound.
type podResult struct {
	Pod         string    `json:"pod"`
	FilterS     float64   `json:"filter_s"`
	PrioritizeS float64   `json:"prioritize_s"`
	PickS       float64   `json:"pick_s"`
	Passed      int       `json:"passed"`
	PassedNames *[]string `json:"passed_names,omitempty"`
	Host        string    `json:"host"`
	BindS       float64   `json:"bind_s"`
	BindError   string    `json:"bind_error,omitempty"`
	bindDone    chan struct{}
}

type summary struct {
	Done   bool    `json:"done"`
	WallS  float64 `json:"wall_s"`
	Pods   int     `json:"pods"`
	Dialed int64   `json:"connections_dialed"`
	Error  string  `json:"error,omitempty"`
}

type client struct {
	http   *http.Client
	base   string
	dialed atomic.Int64
}

// newClient builds the transport as kube-scheduler's makeTransport does for plain HTTP (client-go's
// SetTransportDefaults on an empty http.Transport: Go's defaults, MaxIdleConnsPerHost 2 unless set),
// counting the connections it dials.
func newClient(addr string, idle int, timeout time.Duration) *client {
	c := &client{base: "http://" + addr + "/"}
	dialer := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, a string) (net.Conn, error) {
			c.dialed.Add(1)
			return dialer.DialContext(ctx, network, a)
		},
		MaxIdleConnsPerHost: idle,
		IdleConnTimeout:     90 * time.Second,
	}
	c.http = &http.Client{Transport: tr, Timeout: timeout}
	return c
}

// send POSTs one verb's JSON body and decodes the answer into out, as HTTPExtender.send does.
func (c *client) send(verb string, body []byte, out any) error {
	req, err := http.NewRequest(http.MethodPost, c.base+verb, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 200))
		return fmt.Errorf("%s: HTTP %d %q", verb, resp.StatusCode, msg)
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

// sendRaw POSTs one verb's JSON body and returns the answer's bytes (the -decode bytes reading).
func (c *client) sendRaw(verb string, body []byte) ([]byte, error) {
	req, err := http.NewRequest(http.MethodPost, c.base+verb, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: HTTP %d %q", verb, resp.StatusCode, data[:min(len(data), 200)])
	}
	return data, nil
}

var (
	filterHead = []byte(`{"Nodes":null,"NodeNames":[`)
	filterTail = []byte(`],"FailedNodes":{},"FailedAndUnresolvableNodes":{},"Error":""}`)
	hostKey    = []byte(`{"Host":"`)
	scoreKey   = []byte(`","Score":`)
)

// passedNames is the Python client's passed_names: when every node passed, the answer's NodeNames bytes
// are taken as they are (node names hold no quote or comma); any other answer is decoded.
func passedNames(answer []byte) (json.RawMessage, []string, error) {
	if bytes.HasPrefix(answer, filterHead) && bytes.HasSuffix(answer, filterTail) {
		names := answer[len(filterHead)-1 : len(answer)-len(filterTail)+1]
		n := 0
		if len(names) > 2 {
			n = bytes.Count(names, []byte(`","`)) + 1
		}
		return names, make([]string, n), nil
	}
	var res extenderFilterResult
	if err := json.Unmarshal(answer, &res); err != nil {
		return nil, nil, err
	}
	if res.Error != "" {
		return nil, nil, fmt.Errorf("filter: %s", res.Error)
	}
	var passed []string
	if res.NodeNames != nil {
		passed = *res.NodeNames
	}
	raw, err := json.Marshal(passed)
	return raw, passed, err
}

// bestHostBytes is the Python client's best_host: the first host of the highest score read off the
// answer's bytes ({"Host":"name","Score":n} entries, as the extender writes them); any other layout, or a
// count that does not match, is decoded.
func bestHostBytes(answer []byte, hosts int) (string, error) {
	best, bestScore, seen := "", int64(-1), 0
	for rest := answer; ; seen++ {
		i := bytes.Index(rest, hostKey)
		if i < 0 {
			break
		}
		rest = rest[i+len(hostKey):]
		j := bytes.Index(rest, scoreKey)
		if j < 0 {
			seen = -1
			break
		}
		name := rest[:j]
		rest = rest[j+len(scoreKey):]
		score, k := int64(0), 0
		for k < len(rest) && rest[k] >= '0' && rest[k] <= '9' {
			score = score*10 + int64(rest[k]-'0')
			k++
		}
		if k == 0 {
			seen = -1
			break
		}
		if score > bestScore {
			best, bestScore = string(name), score
		}
	}
	if seen == hosts && hosts > 0 {
		return best, nil
	}
	var list []hostPriority
	if err := json.Unmarshal(answer, &list); err != nil {
		return "", err
	}
	if len(list) != hosts {
		return "", fmt.Errorf("prioritize answered %d hosts for %d", len(list), hosts)
	}
	return bestHost(list), nil
}

// scheduleBytes is schedule with the Python client's reading of the answers (-decode bytes): the same
// requests, the same choices, without decoding 5,000 names and scores with encoding/json.
func (c *client) scheduleBytes(j *job, r *podResult, slots chan struct{}, wg *sync.WaitGroup, keepNames bool) error {
	t0 := time.Now()
	answer, err := c.sendRaw("filter", j.Filter)
	if err != nil {
		return err
	}
	r.FilterS = time.Since(t0).Seconds()
	names, passed, err := passedNames(answer)
	if err != nil {
		return err
	}
	r.Passed = len(passed)
	if keepNames {
		if err := json.Unmarshal(names, &passed); err != nil {
			return err
		}
		r.PassedNames = &passed
	}
	if len(passed) == 0 {
		close(r.bindDone)
		return nil
	}
	t1 := time.Now()
	body := make([]byte, 0, len(j.Pod)+len(names)+64)
	body = append(append(append(append(body, `{"Pod":`...), j.Pod...), `,"Nodes":null,"NodeNames":`...), names...)
	body = append(body, '}')
	scores, err := c.sendRaw("prioritize", body)
	if err != nil {
		return err
	}
	t2 := time.Now()
	r.PrioritizeS = t2.Sub(t1).Seconds()
	if r.Host, err = bestHostBytes(scores, len(passed)); err != nil {
		return err
	}
	return c.bind(j, r, slots, wg, t2)
}

// bestHost is the first host of the highest score (the Python client's max(..., key=Score)).
func bestHost(list []hostPriority) string {
	best := 0
	for i := range list {
		if list[i].Score > list[best].Score {
			best = i
		}
	}
	return list[best].Host
}

// schedule runs the chain for one pod; the bind goes to its own goroutine (at most `slots` in flight).
func (c *client) schedule(j *job, r *podResult, slots chan struct{}, wg *sync.WaitGroup, keepNames bool) error {
	t0 := time.Now()
	var filtered extenderFilterResult
	if err := c.send("filter", j.Filter, &filtered); err != nil {
		return err
	}
	r.FilterS = time.Since(t0).Seconds()
	if filtered.Error != "" {
		return fmt.Errorf("filter %s: %s", j.PodName, filtered.Error)
	}
	var passed []string
	if filtered.NodeNames != nil {
		passed = *filtered.NodeNames
	}
	r.Passed = len(passed)
	if keepNames {
		r.PassedNames = &passed
	}
	if len(passed) == 0 {
		close(r.bindDone)
		return nil // unschedulable
	}
	t1 := time.Now()
	body, err := json.Marshal(extenderArgs{Pod: j.Pod, NodeNames: &passed})
	if err != nil {
		return err
	}
	var scores []hostPriority
	if err := c.send("prioritize", body, &scores); err != nil {
		return err
	}
	t2 := time.Now()
	r.PrioritizeS = t2.Sub(t1).Seconds()
	if len(scores) != len(passed) {
		return fmt.Errorf("prioritize answered %d hosts for %d", len(scores), len(passed))
	}
	r.Host = bestHost(scores)
	return c.bind(j, r, slots, wg, t2)
}

// bind encodes the pod's ExtenderBindingArgs and sends it in a goroutine of its own (at most `slots` in
// flight), as kube-scheduler's binding cycle runs; PickS runs from the prioritize answer to here.
func (c *client) bind(j *job, r *podResult, slots chan struct{}, wg *sync.WaitGroup, t2 time.Time) error {
	bind, err := json.Marshal(extenderBindingArgs{PodName: j.PodName, PodNamespace: j.PodNamespace,
		PodUID: j.PodUID, Node: r.Host})
	if err != nil {
		return err
	}
	r.PickS = time.Since(t2).Seconds()
	wg.Add(1)
	go func() { // the binding cycle, as kube-scheduler runs it: in a goroutine of its own
		defer wg.Done()
		defer close(r.bindDone)
		slots <- struct{}{}
		defer func() { <-slots }()
		t := time.Now()
		var res extenderBindingResult
		if err := c.send("bind", bind, &res); err != nil {
			r.BindError = err.Error()
		} else if res.Error != "" {
			r.BindError = res.Error
		}
		r.BindS = time.Since(t).Seconds()
	}()
	return nil
}

func readJobs(path string) ([]job, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var jobs []job
	dec := json.NewDecoder(bufio.NewReaderSize(f, 1<<20))
	for {
		var j job
		if err := dec.Decode(&j); err == io.EOF {
			return jobs, nil
		} else if err != nil {
			return nil, fmt.Errorf("%s: job %d: %w", path, len(jobs), err)
		}
		jobs = append(jobs, j)
	}
}

func main() {
	addr := flag.String("addr", "", "the extender's host:port (plain HTTP)")
	jobsPath := flag.String("jobs", "", "the job file (one JSON object per pod)")
	bindWorkers := flag.Int("bind-workers", 16, "binds in flight at most")
	idle := flag.Int("idle-conns", 2, "MaxIdleConnsPerHost (kube-scheduler: Go's default, 2)")
	names := flag.Bool("passed-names", false, "print each pod's passed names (tests)")
	decode := flag.String("decode", "bytes", "answers read as the Python client reads them (bytes) or "+
		"decoded whole with encoding/json, as kube-scheduler's HTTPExtender does (full)")
	flag.Parse()
	out := bufio.NewWriter(os.Stdout)
	fail := func(err error) {
		json.NewEncoder(out).Encode(summary{Error: err.Error()})
		out.Flush()
		os.Exit(1)
	}
	if *addr == "" || *jobsPath == "" || *bindWorkers < 1 || *idle < 0 || (*decode != "bytes" && *decode != "full") {
		fail(fmt.Errorf("need -addr HOST:PORT, -jobs FILE, -bind-workers >= 1, -idle-conns >= 0 and " +
			"-decode bytes or full"))
	}
	jobs, err := readJobs(*jobsPath)
	if err != nil {
		fail(err)
	}
	c := newClient(*addr, *idle, 60*time.Second)
	results := make([]podResult, len(jobs))
	for i := range results {
		results[i] = podResult{Pod: jobs[i].PodNamespace + "/" + jobs[i].PodName, bindDone: make(chan struct{})}
	}
	in := bufio.NewReader(os.Stdin)
	fmt.Fprintln(out, "ready")
	out.Flush()
	if _, err := in.ReadString('\n'); err != nil {
		fail(fmt.Errorf("no start line on stdin: %w", err))
	}
	slots := make(chan struct{}, *bindWorkers)
	var wg sync.WaitGroup
	t0 := time.Now()
	for i := range jobs {
		step := c.schedule
		if *decode == "bytes" {
			step = c.scheduleBytes
		}
		if err := step(&jobs[i], &results[i], slots, &wg, *names); err != nil {
			fail(err)
		}
	}
	wg.Wait()
	wall := time.Since(t0).Seconds()
	enc := json.NewEncoder(out)
	for i := range results {
		enc.Encode(&results[i])
	}
	enc.Encode(summary{Done: true, WallS: wall, Pods: len(jobs), Dialed: c.dialed.Load()})
	out.Flush()
	io.Copy(io.Discard, in) // until the caller closes stdin (it reads this process's CPU time first)
}
