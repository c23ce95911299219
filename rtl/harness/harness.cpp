// The Verilator model of incast_switch between real network interfaces.
//
// Each switch port is an interface (a veth end) read and written with an AF_PACKET
// socket: frames that arrive there go into the port's receive side at link rate, and
// every frame the port sends is written out when its last byte leaves the model.
// The model's clock follows CLOCK_MONOTONIC: cycle n happens at n * period after the
// start. Where the model is quiet (nothing in flight) it skips ahead to the next frame or
// timer instead of simulating idle cycles, so under a virtual clock (User-Mode Linux in
// time-travel mode) the model is cycle-true whatever its speed, and in real time it
// falls behind only while busy.
//
// Management: a Unix stream socket (--control PATH), one command a line:
//   w ADDR VALUE   write a register (numbers decimal or 0x-hex)   -> "ok"
//   r ADDR         read one                                       -> the value, decimal
//   now            the cycle counter                              -> decimal
//   stats          cycles simulated, skipped, frames in and out    -> four numbers
// applied between cycles.
//
// Usage: incast_switch_sim --port 0=IFNAME ... [--telemetry IFNAME] [--control PATH]
//          [--period-ps 8000] [--trace FILE.vcd --trace-cycles N]
//        incast_switch_sim --bench CYCLES     (speed: an incast on all ports, no I/O)
//        incast_switch_sim --burst FRAMES --limit BYTES [--trace FILE.vcd]
//                                             (one incast burst, no I/O: every port but the
//                                              last sends FRAMES 1500-byte frames to it)
//        incast_switch_sim [--limit BYTES] --incast SENDERS FRAMES LEN
//                                             (output utilization: SENDERS ports send FRAMES
//                                              LEN-byte frames at once to the last port)
#include "Vincast_switch.h"
#include "verilated.h"
#if VM_TRACE
#include "verilated_vcd_c.h"
#endif

#include <arpa/inet.h>
#include <errno.h>
#include <linux/if_packet.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#ifndef NPORTS
#error "build with -DNPORTS=<ports> -DLW=<link bytes per cycle>"
#endif

namespace {

volatile sig_atomic_t stop_requested = 0;
void on_signal(int) { stop_requested = 1; }

// Bits and bytes of a Verilator port, whatever C++ type its width gave it.
template <typename T> inline uint32_t* words(T& s) { return reinterpret_cast<uint32_t*>(&s); }
template <std::size_t N> inline uint32_t* words(VlWide<N>& s) { return s.data(); }
template <typename T> inline void put_byte(T& s, int i, uint8_t v) {
    if constexpr (sizeof(T) <= 8 && std::is_integral<T>::value) {
        s = (s & ~(T(0xFF) << (8 * i))) | (T(v) << (8 * i));
    } else {
        uint32_t* w = words(s);
        w[i / 4] = (w[i / 4] & ~(0xFFu << (8 * (i % 4)))) | (uint32_t(v) << (8 * (i % 4)));
    }
}
template <typename T> inline uint8_t get_byte(T& s, int i) {
    if constexpr (sizeof(T) <= 8 && std::is_integral<T>::value) return uint8_t(s >> (8 * i));
    else return uint8_t(words(s)[i / 4] >> (8 * (i % 4)));
}
template <typename T> inline void put_bit(T& s, int i, bool v) {
    if constexpr (sizeof(T) <= 8 && std::is_integral<T>::value) {
        s = (s & ~(T(1) << i)) | (T(v) << i);
    } else {
        uint32_t* w = words(s);
        w[i / 32] = (w[i / 32] & ~(1u << (i % 32))) | (uint32_t(v) << (i % 32));
    }
}
template <typename T> inline bool get_bit(T& s, int i) {
    if constexpr (sizeof(T) <= 8 && std::is_integral<T>::value) return (s >> i) & 1;
    else return (words(s)[i / 32] >> (i % 32)) & 1;
}
template <typename T> inline void clear(T& s) {
    if constexpr (sizeof(T) <= 8 && std::is_integral<T>::value) s = 0;
    else std::memset(words(s), 0, sizeof(T));
}

struct Frame {
    std::vector<uint8_t> bytes;
};

// One side of a wire into the model: frames in at LW bytes a cycle, with the gap a
// MAC leaves between them. The frames waiting here have left the host's queue but not
// yet its MAC: as a NIC does, the inlet obeys the PAUSE (or PFC) the switch sends to
// that port, finishing the frame on the wire and starting none until the pause ends.
// (The host's own queue obeys it too, through hosts/pause_agent.py; without this, the
// frames its token bucket released back to back would reach the switch through a pause.)
struct Inlet {
    std::deque<Frame> pending;
    size_t pos = 0;
    bool in_frame = false;
    int gap = 0;
    uint64_t paused_until = 0;   // cycle
    bool idle() const { return pending.empty() && !in_frame && gap == 0; }
    // Something moves on this wire at cycle now (a paused queue waits for its wake).
    bool busy(uint64_t now) const { return in_frame || gap || (!pending.empty() && now >= paused_until); }
};

// A MAC Control frame the switch sent toward a host: the pause it asks of the host's MAC.
void obey(Inlet& s, const std::vector<uint8_t>& f, uint64_t now) {
    if (f.size() < 18 || f[12] != 0x88 || f[13] != 0x08) return;
    const uint64_t quantum = 512 / (8 * LW);   // 512 bit times
    unsigned opcode = f[14] << 8 | f[15];
    if (opcode == 0x0001) {
        unsigned q = f[16] << 8 | f[17];
        s.paused_until = now + q * quantum;
    } else if (opcode == 0x0101 && f.size() >= 34) {
        // the host has one queue: a PFC frame for any class holds all of it
        unsigned enable = f[17], longest = 0;
        bool any = false;
        for (int c = 0; c < 8; c++)
            if (enable >> c & 1) {
                unsigned q = f[18 + 2 * c] << 8 | f[19 + 2 * c];
                any = true;
                if (q > longest) longest = q;
            }
        if (any) s.paused_until = now + longest * quantum;
    }
}

struct Outlet {
    std::vector<uint8_t> buf;
};

int wire_gap(size_t len) {
    size_t wire = (len + 4 < 64 ? 64 : len + 4) + 20;
    return int((wire + LW - 1) / LW - (len + LW - 1) / LW);
}

uint64_t mono_ns() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return uint64_t(ts.tv_sec) * 1000000000ull + ts.tv_nsec;
}

int open_port(const std::string& ifname) {
    int fd = socket(AF_PACKET, SOCK_RAW | SOCK_NONBLOCK, htons(ETH_P_ALL));
    if (fd < 0) { perror("socket"); exit(2); }
    sockaddr_ll sll{};
    sll.sll_family = AF_PACKET;
    sll.sll_protocol = htons(ETH_P_ALL);
    sll.sll_ifindex = if_nametoindex(ifname.c_str());
    if (!sll.sll_ifindex) { fprintf(stderr, "no interface %s\n", ifname.c_str()); exit(2); }
    if (bind(fd, reinterpret_cast<sockaddr*>(&sll), sizeof sll) < 0) { perror("bind"); exit(2); }
    int one = 1;
    setsockopt(fd, SOL_PACKET, PACKET_IGNORE_OUTGOING, &one, sizeof one);   // not our own frames
    int buf = 8 << 20;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    return fd;
}

class Sim {
  public:
    explicit Sim(uint64_t period_ps) : period_ps_(period_ps) {
        ctx_.reset(new VerilatedContext);
        top_.reset(new Vincast_switch{ctx_.get()});
        clear(top_->rx_valid);
        clear(top_->rx_data);
        clear(top_->rx_keep);
        clear(top_->rx_last);
        top_->mgmt_we = 0;
        top_->skip_valid = 0;
        top_->rst = 1;
        for (int i = 0; i < 4; i++) edge();
        top_->rst = 0;
    }
    ~Sim() {
#if VM_TRACE
        if (trace_) trace_->close();
#endif
        top_->final();
    }

    void trace(const char* path, uint64_t cycles) {
#if VM_TRACE
        ctx_->traceEverOn(true);
        trace_.reset(new VerilatedVcdC);
        top_->trace(trace_.get(), 1);   // the switch's own signals, not its ports' insides
        trace_->open(path);
        trace_left_ = cycles;
#else
        (void)path; (void)cycles;
        fprintf(stderr, "this model was built without tracing (make TRACE=1)\n");
        exit(2);
#endif
    }

    uint64_t now() const { return top_->now; }
    bool quiet() const { return top_->quiet; }
    uint64_t wake() const { return top_->wake; }

    // One clock cycle: outputs of the cycle are collected, inputs driven, clock edge.
    template <typename OnFrame> void cycle(std::vector<Inlet>& in, std::vector<Outlet>& out, Outlet& tel,
                                           OnFrame&& on_frame) {
        for (int p = 0; p < NPORTS; p++) {
            if (!get_bit(top_->tx_valid, p)) continue;
            for (int i = 0; i < LW; i++)
                if (get_bit(top_->tx_keep, p * LW + i)) out[p].buf.push_back(get_byte(top_->tx_data, p * LW + i));
            if (get_bit(top_->tx_last, p)) { on_frame(p, out[p].buf); out[p].buf.clear(); }
        }
        if (top_->tel_valid) {
            for (int i = 0; i < LW; i++)
                if (get_bit(top_->tel_keep, i)) tel.buf.push_back(get_byte(top_->tel_data, i));
            if (top_->tel_last) { on_frame(-1, tel.buf); tel.buf.clear(); }
        }
        for (int p = 0; p < NPORTS; p++) {
            Inlet& s = in[p];
            bool valid = false, last = false;
            if (!s.in_frame && s.gap == 0 && !s.pending.empty() && now() >= s.paused_until) {
                s.in_frame = true;
                s.pos = 0;
            }
            if (s.in_frame) {
                const auto& f = s.pending.front().bytes;
                valid = true;
                for (int i = 0; i < LW; i++) {
                    bool k = s.pos + i < f.size();
                    put_bit(top_->rx_keep, p * LW + i, k);
                    put_byte(top_->rx_data, p * LW + i, k ? f[s.pos + i] : 0);
                }
                s.pos += LW;
                if (s.pos >= f.size()) {
                    last = true;
                    s.gap = wire_gap(f.size());
                    s.in_frame = false;
                    s.pending.pop_front();
                    frames_in_++;
                }
            } else if (s.gap) {
                s.gap--;
            }
            put_bit(top_->rx_valid, p, valid);
            put_bit(top_->rx_last, p, last);
        }
        edge();
        simulated_++;
    }

    // Jump the clock over n idle cycles (only while quiet() and nothing arrives).
    void skip(uint64_t n) {
        while (n > 0) {
            uint64_t k = n > 0xFFFFFFFFull ? 0xFFFFFFFFull : n;
            clear(top_->rx_valid);
            top_->skip_valid = 1;
            top_->skip_cycles = uint32_t(k - 1);   // this edge is one cycle itself
            edge();
            top_->skip_valid = 0;
            skipped_ += k;
            n -= k;
        }
    }

    void write(uint32_t addr, uint32_t value) {
        top_->mgmt_addr = addr;
        top_->mgmt_wdata = value;
        top_->mgmt_we = 1;
        clear(top_->rx_valid);
        edge();
        top_->mgmt_we = 0;
        simulated_++;
    }
    uint32_t read(uint32_t addr) {
        top_->mgmt_addr = addr;
        top_->eval();
        return top_->mgmt_rdata;
    }

    uint64_t simulated_ = 0, skipped_ = 0, frames_in_ = 0, frames_out_ = 0;

  private:
    void edge() {
        top_->clk = 0;
        top_->eval();
        dump();
        top_->clk = 1;
        top_->eval();
        dump();
    }
    void dump() {
#if VM_TRACE
        if (trace_ && trace_left_) {
            trace_->dump(ctx_->time());
            ctx_->timeInc(period_ps_ / 2);
            if (--trace_left_ == 0) trace_->close();
        }
#endif
    }
    uint64_t period_ps_;
    std::unique_ptr<VerilatedContext> ctx_;
    std::unique_ptr<Vincast_switch> top_;
#if VM_TRACE
    std::unique_ptr<VerilatedVcdC> trace_;
    uint64_t trace_left_ = 0;
#endif
};

uint32_t number(const char* s) { return uint32_t(strtoul(s, nullptr, 0)); }

// A control connection's command, answered at once.
std::string command(Sim& sim, const std::string& line) {
    char op[16] = {0}, a[32] = {0}, b[32] = {0};
    int n = sscanf(line.c_str(), "%15s %31s %31s", op, a, b);
    if (n >= 3 && !strcmp(op, "w")) { sim.write(number(a), number(b)); return "ok\n"; }
    if (n >= 2 && !strcmp(op, "r")) return std::to_string(sim.read(number(a))) + "\n";
    if (n >= 1 && !strcmp(op, "now")) return std::to_string(sim.now()) + "\n";
    if (n >= 1 && !strcmp(op, "stats"))
        return std::to_string(sim.simulated_) + " " + std::to_string(sim.skipped_) + " " +
               std::to_string(sim.frames_in_) + " " + std::to_string(sim.frames_out_) + "\n";
    return "error\n";
}

// Speed: every port but the last sends 1500-byte frames to the last port, back to back.
int bench(uint64_t cycles) {
    Sim sim(8000);
    for (int p = 0; p < NPORTS; p++) {
        uint64_t mac = 0x020000000001ull + p;
        sim.write(0x0400 + p * 2, uint32_t(mac));
        sim.write(0x0401 + p * 2, uint32_t(mac >> 32) | (uint32_t(p) << 16) | 0x80000000u);
        for (int c = 0; c < 8; c++) sim.write(0x1000 + p * 8 + c, 65536);
    }
    std::vector<Inlet> in(NPORTS);
    std::vector<Outlet> out(NPORTS);
    Outlet tel;
    uint64_t out_frames = 0;
    auto t0 = mono_ns();
    while (sim.simulated_ < cycles) {
        for (int p = 0; p + 1 < NPORTS; p++)
            if (in[p].pending.size() < 2) {
                Frame f;
                f.bytes.assign(1500, 0);
                uint64_t dst = 0x020000000001ull + NPORTS - 1, src = 0x020000000001ull + p;
                for (int i = 0; i < 6; i++) { f.bytes[i] = uint8_t(dst >> (40 - 8 * i)); f.bytes[6 + i] = uint8_t(src >> (40 - 8 * i)); }
                f.bytes[12] = 0x88; f.bytes[13] = 0xB6;
                in[p].pending.push_back(std::move(f));
            }
        sim.cycle(in, out, tel, [&](int, std::vector<uint8_t>&) { out_frames++; });
    }
    double s = (mono_ns() - t0) / 1e9;
    printf("{\"ports\": %d, \"lw\": %d, \"cycles\": %llu, \"seconds\": %.3f, \"cycles_per_s\": %.0f, "
           "\"frames_in_per_s\": %.0f, \"frames_out_per_s\": %.0f}\n",
           NPORTS, LW, (unsigned long long)sim.simulated_, s, sim.simulated_ / s, sim.frames_in_ / s,
           out_frames / s);
    return 0;
}

// Port p's host (MAC 02:00:00:00:00:p+1) in the forwarding table, and every port's
// class-0 queue limited to `limit` bytes: the set-up of the no-I/O modes below.
static void learn_hosts(Sim& sim, uint32_t limit) {
    for (int p = 0; p < NPORTS; p++) {
        uint64_t mac = 0x020000000001ull + p;
        sim.write(0x0400 + p * 2, uint32_t(mac));
        sim.write(0x0401 + p * 2, uint32_t(mac >> 32) | (uint32_t(p) << 16) | 0x80000000u);
        sim.write(0x1000 + p * 8, limit);
    }
}

// A `len`-byte frame from port src's host to port dst's, of a local experimental
// EtherType (0x88B6), its sender and sequence number in bytes 14 and 15.
static Frame test_frame(int src, int dst, int k, int len) {
    Frame f;
    f.bytes.assign(len, 0);
    uint64_t d = 0x020000000001ull + dst, s = 0x020000000001ull + src;
    for (int i = 0; i < 6; i++) { f.bytes[i] = uint8_t(d >> (40 - 8 * i)); f.bytes[6 + i] = uint8_t(s >> (40 - 8 * i)); }
    f.bytes[12] = 0x88; f.bytes[13] = 0xB6;
    f.bytes[14] = uint8_t(src); f.bytes[15] = uint8_t(k);
    return f;
}

// One incast burst: every port but the last sends `frames` 1500-byte frames to the
// last port at line rate, its class-0 queue limited to `limit` bytes; run until the
// switch is quiet. Prints what happened (and a waveform with --trace).
int burst(int frames, uint32_t limit, const std::string& trace_path) {
    Sim sim(8000);
    if (!trace_path.empty()) sim.trace(trace_path.c_str(), 100000000);
    learn_hosts(sim, limit);
    std::vector<Inlet> in(NPORTS);
    std::vector<Outlet> out(NPORTS);
    Outlet tel;
    for (int p = 0; p + 1 < NPORTS; p++)
        for (int k = 0; k < frames; k++) {
            in[p].pending.push_back(test_frame(p, NPORTS - 1, k, 1500));
        }
    uint64_t received = 0, quiet_for = 0;
    while (quiet_for < 1000) {
        sim.cycle(in, out, tel, [&](int p, std::vector<uint8_t>&) { if (p == NPORTS - 1) received++; });
        bool idle = sim.quiet();
        for (auto& s : in) idle = idle && s.idle();
        quiet_for = idle ? quiet_for + 1 : 0;
    }
    printf("{\"sent\": %d, \"received\": %llu, \"dropped\": %u, \"cycles\": %llu}\n", frames * (NPORTS - 1),
           (unsigned long long)received, sim.read(0x6000 + (NPORTS - 1) * 8), (unsigned long long)sim.now());
    return 0;
}


// Output utilization under incast: `senders` ports each send `frames` frames of `len`
// bytes back to back to the last port; prints the last port's busy share between its
// first and last byte, and per-frame latencies (first byte in -> last byte out).
int incast_util(int senders, int frames, int len, uint32_t limit) {
    Sim sim(8000);
    learn_hosts(sim, limit);
    std::vector<Inlet> in(NPORTS);
    std::vector<Outlet> out(NPORTS);
    Outlet tel;
    const int dstp = NPORTS - 1;
    for (int p = 0; p < senders; p++)
        for (int k = 0; k < frames; k++) {
            in[p].pending.push_back(test_frame(p, dstp, k, len));
        }
    uint64_t received = 0, quiet_for = 0, first = 0, last = 0, busy = 0, outbytes = 0;
    double lat_sum = 0; uint64_t lat_max = 0;
    uint64_t t0 = sim.now();
    while (quiet_for < 1000) {
        uint64_t before = sim.now();
        sim.cycle(in, out, tel, [&](int p, std::vector<uint8_t>& f) {
            if (p != dstp) return;
            received++;
            outbytes += f.size();
            if (!first) first = before - f.size() + 1;
            last = before;
            // every sender's k-th frame entered at t0 + k * (len + gap) (+1 for the first byte)
            int k = f[15];
            uint64_t entered = t0 + uint64_t(k) * (len + wire_gap(len));
            uint64_t lat = before - entered;
            lat_sum += lat; if (lat > lat_max) lat_max = lat;
        });
        bool idle = sim.quiet();
        for (auto& s : in) idle = idle && s.idle();
        quiet_for = idle ? quiet_for + 1 : 0;
    }
    (void)busy;
    uint64_t span = last - first + 1;
    uint64_t ideal = received * (len + wire_gap(len)) - wire_gap(len);
    printf("{\"senders\": %d, \"frames\": %d, \"sent\": %d, \"received\": %llu, \"dropped\": %u, \"rx_errors\": %u, "
           "\"first_out\": %llu, \"span\": %llu, \"ideal_span\": %llu, \"utilization\": %.4f, "
           "\"lat_mean\": %.1f, \"lat_max\": %llu}\n",
           senders, frames, senders * frames, (unsigned long long)received, sim.read(0x6000 + dstp * 8),
           [&]{ uint32_t e = 0; for (int p = 0; p < NPORTS; p++) e += sim.read(0xB000 + 8 * p + 6); return e; }(),
           (unsigned long long)(first - t0), (unsigned long long)span, (unsigned long long)ideal,
           double(ideal) / span, received ? lat_sum / received : 0.0, (unsigned long long)lat_max);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    std::vector<std::string> ifnames(NPORTS);
    std::string tel_if, control_path, trace_path;
    uint64_t period_ps = 8000, trace_cycles = 0;
    int burst_frames = 0;
    bool log_frames = false;
    uint32_t burst_limit = 8192;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        auto next = [&]() -> std::string { if (i + 1 >= argc) { fprintf(stderr, "%s needs a value\n", a.c_str()); exit(2); } return argv[++i]; };
        if (a == "--port") {
            std::string v = next();
            auto eq = v.find('=');
            int p = atoi(v.substr(0, eq).c_str());
            if (eq == std::string::npos || p < 0 || p >= NPORTS) { fprintf(stderr, "--port N=IFNAME, N < %d\n", NPORTS); return 2; }
            ifnames[p] = v.substr(eq + 1);
        } else if (a == "--telemetry") tel_if = next();
        else if (a == "--control") control_path = next();
        else if (a == "--period-ps") period_ps = strtoull(next().c_str(), nullptr, 0);
        else if (a == "--trace") trace_path = next();
        else if (a == "--trace-cycles") trace_cycles = strtoull(next().c_str(), nullptr, 0);
        else if (a == "--bench") return bench(strtoull(next().c_str(), nullptr, 0));
        else if (a == "--burst") burst_frames = atoi(next().c_str());
        else if (a == "--incast") {
            int n = atoi(next().c_str()), fr = atoi(next().c_str()), len = atoi(next().c_str());
            return incast_util(n, fr, len, burst_limit);
        }
        else if (a == "--limit") burst_limit = uint32_t(strtoul(next().c_str(), nullptr, 0));
        else if (a == "--log-frames") log_frames = true;   // each frame in and out, with its cycle
        else if (a == "--info") { printf("{\"ports\": %d, \"lw\": %d}\n", NPORTS, LW); return 0; }
        else { fprintf(stderr, "unknown argument %s\n", a.c_str()); return 2; }
    }
    if (burst_frames > 0) return burst(burst_frames, burst_limit, trace_path);
    // Our waits are of a few microseconds; the kernel's default timer slack (50 us)
    // would stretch each of them, and under a virtual clock that stretch is real time
    // the model falls behind and then makes up in a rush.
    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    signal(SIGPIPE, SIG_IGN);

    Sim sim(period_ps);
    if (!trace_path.empty()) sim.trace(trace_path.c_str(), trace_cycles ? trace_cycles : 1000000);

    std::vector<int> fds(NPORTS, -1);
    for (int p = 0; p < NPORTS; p++)
        if (!ifnames[p].empty()) fds[p] = open_port(ifnames[p]);
    int tel_fd = tel_if.empty() ? -1 : open_port(tel_if);

    int listen_fd = -1;
    // A control client: the commands it sent that are not yet whole lines, and the
    // answers it has not yet taken (its socket full: they wait, in order, for POLLOUT;
    // an answer dropped would leave the client waiting for it for ever).
    struct Client { int fd; std::string in, out; };
    std::vector<Client> clients;
    auto flush = [](Client& c) {
        while (!c.out.empty()) {
            ssize_t n = write(c.fd, c.out.data(), c.out.size());
            if (n <= 0) return n == 0 || errno == EAGAIN || errno == EINTR;
            c.out.erase(0, size_t(n));
        }
        return true;
    };
    auto client_events = [](const Client& c) { return short(POLLIN | (c.out.empty() ? 0 : POLLOUT)); };
    if (!control_path.empty()) {
        listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0);
        sockaddr_un sun{};
        sun.sun_family = AF_UNIX;
        strncpy(sun.sun_path, control_path.c_str(), sizeof sun.sun_path - 1);
        unlink(control_path.c_str());
        if (bind(listen_fd, reinterpret_cast<sockaddr*>(&sun), sizeof sun) < 0 || listen(listen_fd, 4) < 0) {
            perror("control socket");
            return 2;
        }
    }
    printf("ready\n");
    fflush(stdout);

    std::vector<Inlet> in(NPORTS);
    std::vector<Outlet> out(NPORTS);
    Outlet tel;
    std::vector<uint8_t> rbuf(65536);
    const uint64_t t0 = mono_ns();
    const uint64_t c0 = sim.now();
    auto target = [&]() { return c0 + (mono_ns() - t0) * 1000 / period_ps; };
    auto on_frame = [&](int p, std::vector<uint8_t>& f) {
        if (log_frames)
            fprintf(stderr, "%llu out %d %zu %02x%02x\n", (unsigned long long)sim.now(), p, f.size(),
                    f.size() > 13 ? f[12] : 0, f.size() > 13 ? f[13] : 0);
        int fd = p < 0 ? tel_fd : fds[p];
        if (fd >= 0 && !f.empty()) {
            if (send(fd, f.data(), f.size(), 0) < 0 && errno != EAGAIN && errno != ENOBUFS && errno != ENXIO)
                perror("send");
        }
        if (p >= 0) obey(in[p], f, sim.now());
        sim.frames_out_++;
    };

    while (!stop_requested) {
        // Catch up with the clock first, with the frames that came before now: a frame
        // read below arrived now, not when the model last stopped (after a long wait
        // the model would otherwise take it that far back in time).
        // Simulate while something moves, skip while quiet.
        uint64_t goal = target();
        bool inputs = false;
        for (int p = 0; p < NPORTS; p++) if (in[p].busy(sim.now())) { inputs = true; break; }
        while (sim.now() < goal) {
            if (!inputs && sim.quiet()) {
                uint64_t w = sim.wake();
                for (auto& s : in)   // a paused wire with frames waiting: when it resumes
                    if (!s.pending.empty() && s.paused_until > sim.now() && (w <= sim.now() || s.paused_until < w))
                        w = s.paused_until;
                uint64_t to = (w > sim.now() && w < goal) ? w : goal;
                sim.skip(to - sim.now());
                if (to == goal) break;
            }
            sim.cycle(in, out, tel, on_frame);
            inputs = false;
            for (int p = 0; p < NPORTS; p++) if (in[p].busy(sim.now())) { inputs = true; break; }
            if ((sim.simulated_ & 1023) == 0) break;   // look at the sockets now and then
        }
        // What is ready, in one system call. Under User-Mode Linux in virtual time each
        // system call the harness makes costs virtual time (~0.8 us measured: a wake every
        // 1504 cycles where 125 were asked for, with 9 ports); a recv on every port, every
        // iteration, cost more than the 1024 cycles an iteration simulates while behind,
        // so with many ports the model fell ever further behind the hosts while busy.
        std::vector<pollfd> ready;
        for (int fd : fds) if (fd >= 0) ready.push_back({fd, POLLIN, 0});
        if (tel_fd >= 0) ready.push_back({tel_fd, POLLIN, 0});
        if (listen_fd >= 0) ready.push_back({listen_fd, POLLIN, 0});
        for (auto& c : clients) ready.push_back({c.fd, client_events(c), 0});
        bool any_ready = poll(ready.data(), ready.size(), 0) > 0;
        auto is_ready = [&](int fd) {
            if (!any_ready) return false;
            for (auto& r : ready) if (r.fd == fd) return (r.revents & (POLLIN | POLLERR | POLLHUP)) != 0;
            return false;
        };
        auto is_writable = [&](int fd) {
            if (!any_ready) return false;
            for (auto& r : ready) if (r.fd == fd) return (r.revents & POLLOUT) != 0;
            return false;
        };
        // Frames that arrived: they enter their port now.
        for (int p = 0; p < NPORTS; p++) {
            if (fds[p] < 0 || !is_ready(fds[p])) continue;
            for (;;) {
                ssize_t n = recv(fds[p], rbuf.data(), rbuf.size(), MSG_TRUNC);
                if (n <= 0) break;
                Frame f;
                f.bytes.assign(rbuf.begin(), rbuf.begin() + (n < ssize_t(rbuf.size()) ? n : ssize_t(rbuf.size())));
                if (log_frames)
                    fprintf(stderr, "%llu in %d %zu %02x%02x backlog %zu\n", (unsigned long long)sim.now(), p,
                            f.bytes.size(), f.bytes.size() > 13 ? f.bytes[12] : 0, f.bytes.size() > 13 ? f.bytes[13] : 0,
                            in[p].pending.size());
                in[p].pending.push_back(std::move(f));
            }
        }
        if (tel_fd >= 0 && is_ready(tel_fd))   // nothing comes in at the collector port: keep its queue empty
            while (recv(tel_fd, rbuf.data(), rbuf.size(), 0) > 0) {}
        // Management.
        if (listen_fd >= 0) {
            std::vector<bool> readable, writable;
            for (auto& c : clients) { readable.push_back(is_ready(c.fd)); writable.push_back(is_writable(c.fd)); }
            if (is_ready(listen_fd)) {
                int c = accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK);
                if (c >= 0) { clients.push_back({c, {}, {}}); readable.push_back(true); writable.push_back(false); }
            }
            for (size_t i = 0; i < clients.size();) {
                Client& c = clients[i];
                bool gone = false;
                if (readable[i]) {
                    char b[4096];
                    ssize_t n = recv(c.fd, b, sizeof b, 0);
                    if (n == 0 || (n < 0 && errno != EAGAIN)) gone = true;
                    else if (n > 0) {
                        c.in.append(b, n);
                        size_t nl;
                        while ((nl = c.in.find('\n')) != std::string::npos) {
                            c.out += command(sim, c.in.substr(0, nl));
                            c.in.erase(0, nl + 1);
                        }
                    }
                }
                if (!gone && (readable[i] || writable[i])) gone = !flush(c);
                if (gone) {
                    close(c.fd);
                    clients.erase(clients.begin() + i);
                    readable.erase(readable.begin() + i);
                    writable.erase(writable.begin() + i);
                    continue;
                }
                i++;
            }
        }
        if (sim.now() < goal) continue;   // behind (real time): read again, then go on
        inputs = false;
        for (int p = 0; p < NPORTS; p++) if (in[p].busy(sim.now())) { inputs = true; break; }
        // Caught up: wait for a frame, a command, or the time the model next needs.
        uint64_t wait_ns = 100000000;   // commands and stop requests, at least every 100 ms
        if (!sim.quiet() || inputs) wait_ns = 1000;
        else {
            uint64_t w = sim.wake() > sim.now() ? sim.wake() : 0;
            for (auto& s : in)
                if (!s.pending.empty() && s.paused_until > sim.now() && (w == 0 || s.paused_until < w))
                    w = s.paused_until;
            if (w > sim.now() && (w - sim.now()) * period_ps / 1000 < wait_ns) wait_ns = (w - sim.now()) * period_ps / 1000;
        }
        std::vector<pollfd> pfds;
        for (int fd : fds) if (fd >= 0) pfds.push_back({fd, POLLIN, 0});
        if (listen_fd >= 0) pfds.push_back({listen_fd, POLLIN, 0});
        for (auto& c : clients) pfds.push_back({c.fd, client_events(c), 0});
        timespec ts{time_t(wait_ns / 1000000000ull), long(wait_ns % 1000000000ull)};
        ppoll(pfds.data(), pfds.size(), &ts, nullptr);
    }
    for (int fd : fds) if (fd >= 0) close(fd);
    if (tel_fd >= 0) close(tel_fd);
    for (auto& c : clients) close(c.fd);
    if (listen_fd >= 0) { close(listen_fd); unlink(control_path.c_str()); }
    return 0;
}
