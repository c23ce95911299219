"""The scenario model: one typed, validated description of an incast experiment.

The CLI, the sweep driver, the pytest suite and the labs all build a :class:`Scenario`
(from a TOML file, from ``--flags``, from ``field=value`` overrides) and hand it to the
runner. Nothing touches the machine before a scenario has validated.

Every field is documented in README.md ("Scenario fields"). Sizes are stored in bytes,
rates in bit/s and times in µs, whatever unit the user wrote.
"""
from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, create_model,
                      field_validator, model_validator)

from incast import clock as clocks
from incast import testbed, topology
from incast.constants import ETH_HLEN
from incast.eras import TCP_ERAS
from incast.errors import ScenarioError
from incast.registry import DATAPLANES, WORKLOADS
from incast.units import (format_rate, format_size, format_time_us, keep_given_buffer_unit, parse_rate, parse_size,
                          parse_time_us)

Size = Annotated[int, BeforeValidator(parse_size), Field(ge=0)]
Rate = Annotated[int, BeforeValidator(parse_rate), Field(gt=0)]
TimeUs = Annotated[int, BeforeValidator(parse_time_us), Field(ge=0)]


def _rto_min(value):
    if isinstance(value, str) and value.strip().lower() == "min":
        return "min"
    return parse_time_us(value)


RtoMin = Annotated[Union[Literal["min"], Annotated[int, Field(ge=1, le=120_000_000)]],
                   BeforeValidator(_rto_min)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def _registered(what: str, names):
    """A validator: the value must be one of names() (a registry's keys)."""
    def check(value):
        known = list(names())
        if value not in known:
            raise ValueError(f"unknown {what} {value!r}; one of: {', '.join(known)}")
        return value
    return AfterValidator(check)


def _testbeds():
    return testbed.known()


def _dataplanes():
    return DATAPLANES


def _topologies():
    return topology.known()


# SIGCOMM'09 Figure 13's largest point.
MAX_SENDERS = 2048
# Fields of any topology whose switches are joined by trunks; the others beyond kind
# and senders are parameters of the topologies that declare them (topologies/*.py).
TRUNK_FIELDS = ("trunk_rate", "trunk_buffer")


def _kinds(kinds: list[str]) -> str:
    if len(kinds) == 1:
        return f"kind {kinds[0]}"
    return "kinds " + (" and ".join(kinds) if len(kinds) == 2 else ", ".join(kinds))


class Topology(_Model):
    """Which Mininet topology (a file in topologies/) and how many servers answer. What
    a topology has (its hosts, its ports, its trunks) is asked of its Topo, built."""
    kind: Annotated[str, _registered("topology", _topologies)] = "star"   # topologies/<kind>.py
    senders: int = Field(1, ge=1, le=MAX_SENDERS, description="servers answering each block (beyond a "
                         "switch's ports: topology fan_in)")
    far: int | None = Field(None, ge=0, le=MAX_SENDERS,
                            description="two_switch, leaf_spine: servers on the second switch (default half)")
    others: int = Field(0, ge=0, le=64, description="extra hosts per switch (near1.., far1..) for background traffic")
    trunk_rate: Rate | None = Field(
        None, description="rate of links between switches (default link.rate)")
    trunk_buffer: Size | None = Field(
        None, description="bytes per trunk port (default switch.buffer): deep, a trunk is no second bottleneck")
    spines: int | None = Field(None, ge=1, le=4, description="leaf_spine: spine switches (default 2)")
    edges: int | None = Field(None, ge=1, le=64,
                              description="fan_in: edge switches the servers spread over (default one per 1000)")

    @model_validator(mode="after")
    def _fits_the_kind(self):
        declared = topology.parameters(self.kind)
        for name, f in type(self).model_fields.items():
            if name in ("kind", "senders") or getattr(self, name) == f.default:
                continue
            if name in TRUNK_FIELDS:
                fits, kinds = topology.trunked(self.kind), [k for k in topology.known() if topology.trunked(k)]
            else:
                fits, kinds = name in declared, [k for k in topology.known() if name in topology.parameters(k)]
            if not fits:
                raise ValueError(f"topology.{name} is for {_kinds(kinds)}, not {self.kind}")
        self._facts()       # the topology refuses what it cannot build
        return self

    def _facts(self):
        given = tuple((n, getattr(self, n)) for n in topology.parameters(self.kind) if getattr(self, n) is not None)
        return topology.facts(self.kind, self.senders, given)

    def params(self) -> dict:
        """Keyword arguments of the Topo class beyond senders, as it resolves them."""
        return dict(self._facts().params)

    def most_hosts_on_a_switch(self) -> int:
        """Ports of the busiest switch (hosts and trunks)."""
        return self._facts().busiest_switch_ports

    def hosts(self) -> list[str]:
        """Every host name the topology has: the client, the servers, the others."""
        return list(self._facts().hosts)

    def trunked(self) -> bool:
        """Whether its switches are several, joined by trunks."""
        return self._facts().trunked


def _rate_or_auto(value):
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    return parse_rate(value)


# "auto": the highest rate calibration found faithful on this machine for the run's
# number of senders (incast.calibrate), resolved when the run starts.
RateOrAuto = Annotated[Union[Literal["auto"], Annotated[int, Field(gt=0)]], BeforeValidator(_rate_or_auto)]


class Link(_Model):
    """Every link of the topology (host NICs and switch ports run at this rate)."""
    rate: RateOrAuto = parse_rate("1Gbit")
    mtu: int = Field(1500, ge=576, le=9000, description="both ends of every link: the hosts' TCP segments "
                     "are this less 52 bytes of headers and timestamps")
    delay: TimeUs = 0
    jitter: TimeUs = 0
    loss: float = Field(0.0, ge=0.0, le=100.0, description="percent, per host egress")

    @property
    def needs_netem(self) -> bool:
        return bool(self.delay or self.jitter or self.loss)

    @model_validator(mode="after")
    def _jitter_needs_delay(self):
        if self.jitter and not self.delay:
            raise ValueError("link.jitter needs link.delay (jitter is variation around a delay)")
        return self


class QoS(_Model):
    """QoS partitioning of each switch port: k class queues sharing the port's buffer.

    Class 0 has the highest (strict) priority. A packet's class comes from its DSCP
    through ``dscp_map``; unmapped DSCPs go to class 0. Servers mark their traffic with
    the DSCP of the class ``sender_class`` gives them.
    """
    queues: int = Field(1, ge=1, le=8)
    weights: list[float] | None = Field(None, description="buffer share per class; default equal")
    dscp_map: dict[int, int] | None = Field(None, description="DSCP -> class; default class c <- DSCP 8*c (CSc)")
    sender_class: int | list[int] = Field(0, description="class of every server, or a list cycled over servers")

    @field_validator("weights")
    @classmethod
    def _positive(cls, v):
        if v is not None and any(w <= 0 for w in v):
            raise ValueError("weights must all be > 0")
        return v

    @model_validator(mode="after")
    def _consistent(self):
        k = self.queues
        if self.weights is not None and len(self.weights) != k:
            raise ValueError(f"weights needs {k} entries (one per queue), got {len(self.weights)}")
        for dscp, cls in (self.dscp_map or {}).items():
            if not 0 <= dscp <= 63:
                raise ValueError(f"dscp_map key {dscp} is not a DSCP (0-63)")
            if not 0 <= cls < k:
                raise ValueError(f"dscp_map sends DSCP {dscp} to class {cls}; classes are 0-{k - 1}")
        classes = self.sender_class if isinstance(self.sender_class, list) else [self.sender_class]
        if not classes:
            raise ValueError("sender_class list is empty")
        for cls in classes:
            if not 0 <= cls < k:
                raise ValueError(f"sender_class {cls} does not exist; classes are 0-{k - 1}")
        return self

    def class_dscp(self) -> dict[int, int]:
        """The DSCP a sender uses to land in each class (lowest DSCP mapped to it)."""
        table = self.dscp_table()
        out: dict[int, int] = {}
        for dscp in range(64):
            out.setdefault(table[dscp], dscp)
        return out

    def dscp_table(self) -> list[int]:
        """Class of each of the 64 DSCPs (the switch's classification rule)."""
        if self.dscp_map is not None:
            mapping = self.dscp_map
        else:
            mapping = {8 * c: c for c in range(self.queues)}
        return [mapping.get(d, 0) for d in range(64)]

    def class_of_sender(self, index: int) -> int:
        if isinstance(self.sender_class, list):
            return self.sender_class[index % len(self.sender_class)]
        return self.sender_class

    def shares(self) -> list[float]:
        w = self.weights or [1.0] * self.queues
        total = sum(w)
        return [x / total for x in w]


class Watchdog(_Model):
    """A pause watchdog (as SONiC's PFC watchdog): a class queue kept paused longer than
    ``detect`` is in a storm; it stops obeying pauses and, with action "drop", drops what
    arrives for it ("forward": sends it anyway), until no pause came for ``restore``."""
    detect: TimeUs = Field(parse_time_us("20ms"), gt=0, description="paused this long = a storm")
    restore: TimeUs = Field(parse_time_us("50ms"), gt=0, description="no pause for this long = over")
    action: Literal["drop", "forward"] = "drop"


class Storm(_Model):
    """A host whose NIC keeps sending PAUSE (a stuck receiver, a broken NIC): from
    ``after`` past the start of the first measured block, for ``duration``."""
    host: str = Field(description="the host that storms, e.g. near1")
    after: TimeUs = Field(0, description="when the storm begins")
    duration: TimeUs = Field(parse_time_us("100ms"), gt=0, description="how long it lasts")


# Frames a sender can still put on its link after its port passed XOFF, before the
# PAUSE stops it: the frame on its wire and the one its NIC has already committed.
PAUSE_FRAMES_IN_FLIGHT = 2


class Pause(_Model):
    """802.3x Ethernet flow control by the switch (or 802.1Qbb PFC: pfc = true).

    When a port's queues hold more than ``xoff`` bytes, the ports sending into it get
    PAUSE frames; once at ``xon`` or below they get quanta 0. The buffer above XOFF is
    the headroom: it must hold, for every paused sender, the frame already on its
    wire plus the one it may start before it reacts. Default XOFF: the buffer less two
    full frames per sender, but no more than half and no less than an eighth of the
    buffer. At XON every paused sender resumes with a frame at once, so the queue's peak
    is about XON plus two frames per sender: default XON is a quarter of XOFF."""
    enabled: bool = False
    xoff: Size | None = None
    xon: Size | None = None
    quanta: int = Field(0xFFFF, ge=1, le=0xFFFF, description="pause quanta sent at XOFF (512 bit times each)")
    # pfc, interval, hosts, watchdog and storm take effect with enabled = true (so that one
    # --set pause=false compares a scenario with its flow control off).
    pfc: bool = Field(False, description="per-priority (802.1Qbb): a class queue above its XOFF pauses that class only")
    interval: TimeUs | None = Field(None, gt=0, description="linux data plane: the switches read their queues "
                                    "this often instead of being told each XOFF/XON crossing by the kernel "
                                    "(default: told where the kernel can, as the UML kernels' plug does; "
                                    "else read every quarter of a full frame's time at the link rate)")
    hosts: Literal["kernel", "agent"] = Field(
        "kernel", description="how the hosts obey PAUSE: kernel, their NIC's plug qdisc obeys it itself "
        "where the kernel can (the UML kernels, kernels/patches-um/0005), else an agent "
        "(hosts/pause_agent.py); agent, the agent on every host")
    watchdog: Watchdog | None = None
    storm: Storm | None = None


class Pool(_Model):
    """A shared buffer: every queue of a switch draws from one pool, and a queue may
    hold at most alpha times the pool's free bytes (a dynamic threshold, as merchant
    switch silicon has: a lone busy port gets alpha/(1+alpha) of the pool, n busy ports
    alpha/(1+n*alpha) each), and at most its own share of switch.buffer (its cap)."""
    size: Size = Field(description="bytes of the pool, shared by every port and class of a switch")
    alpha: float = Field(1.0, ge=1 / 16, le=8.0, multiple_of=1 / 16,
                         description="a queue may hold alpha x the free pool (in sixteenths: 1/16 to 8)")

    @model_validator(mode="after")
    def _fits(self):
        if not 1 <= self.size <= 16 * 1024 * 1024:
            raise ValueError("switch.pool.size: 1 byte to 16 MiB")
        return self

    def lone_queue_bytes(self) -> int:
        """What a queue is sure to be admitted while the rest of the pool is empty: a
        frame of n bytes finding q queued goes in while q + n <= alpha x (size - q),
        so every frame is admitted up to alpha x size / (1 + alpha) bytes."""
        return int(self.alpha * self.size / (1 + self.alpha))


class Switch(_Model):
    """Per-port egress buffer of every switch port, in bytes or (alternatively) packets,
    and optionally a pool they share (switch.pool)."""
    buffer: Size | None = Field(parse_size("32KiB"), description="bytes per port, split over the class queues")
    buffer_packets: int | None = Field(None, ge=1, le=100_000)
    qos: QoS = QoS()
    pause: Pause = Pause()
    # DCTCP's K: a packet that finds more than this in its class queue is marked CE
    # instead of queued unmarked (ECN-capable traffic; the rest is dropped there).
    ecn: Size | None = Field(None, description="marking threshold in bytes per class queue; off when unset")
    pool: Pool | None = Field(None, description="a shared buffer with a dynamic threshold; unset: each "
                              "port has its buffer to itself")

    def held_bytes(self, total: int) -> int:
        """What a queue capped at `total` bytes holds before a drop: its cap, or with a
        pool no more than the pool admits a lone busy queue.

        Why PAUSE places XOFF against this rather than the cap: with a pool the dynamic
        threshold drops long before the cap (a 64 KiB pool under alpha 1 holds a queue
        to 32 KiB whatever its cap), and an XOFF above that is never reached: frames are
        dropped and no PAUSE is sent. Against it, flow control is lossless for one busy
        port (the incast's); with several busy ports the threshold falls further
        (alpha / (1 + n alpha) of the pool each), and drops are counted as ever."""
        return min(total, self.pool.lone_queue_bytes()) if self.pool is not None else total

    def pause_thresholds(self, mtu: int, senders: int, total: int | None = None) -> tuple[int, int]:
        """(xoff, xon) in bytes of the port's queues (or of a queue of `total` bytes: a
        class under PFC), for this many paused senders."""
        if total is None:
            total = self.buffer if self.buffer is not None else self.buffer_packets * (mtu + ETH_HLEN)
        total = self.held_bytes(total)
        headroom = PAUSE_FRAMES_IN_FLIGHT * (mtu + ETH_HLEN) * senders
        default_xoff = min(total // 2, max(total // 8, total - headroom))
        xoff = self.pause.xoff if self.pause.xoff is not None else default_xoff
        xon = min(xoff, self.pause.xon) if self.pause.xon is not None else xoff // 4
        return xoff, xon

    def class_pause_thresholds(self, mtu: int, senders: int) -> list[tuple[int, int]]:
        """(xoff, xon) of each class queue: with one class, the port's; with several,
        each against its own share of the buffer (PFC pauses that class; 802.3x pauses
        the port when any class passes its own)."""
        limits = self.class_limits(mtu)
        if len(limits) == 1:
            return [self.pause_thresholds(mtu, senders)]
        if self.buffer is None:
            limits = [lim * (mtu + ETH_HLEN) for lim in limits]
        return [self.pause_thresholds(mtu, senders, total=lim) for lim in limits]

    def port_pause_thresholds(self, mtu: int, senders: int) -> tuple[int, int]:
        """(xoff, xon) for 802.3x, which compares a port's queues together: the smallest
        class's, since the port's bytes are at least any class's, so the port pauses
        before any class queue can pass its own XOFF."""
        return min(self.class_pause_thresholds(mtu, senders))

    @model_validator(mode="before")
    @classmethod
    def _packets_replace_bytes(cls, data: Any):
        # Giving buffer_packets alone means "count packets, not bytes".
        if isinstance(data, dict) and data.get("buffer_packets") is not None and "buffer" not in data:
            data = {**data, "buffer": None}
        return data

    @model_validator(mode="after")
    def _one_buffer(self):
        if (self.buffer is None) == (self.buffer_packets is None):
            raise ValueError("give exactly one of switch.buffer (bytes) and switch.buffer_packets")
        if self.pause.enabled and self.buffer is None:
            raise ValueError("switch.pause needs switch.buffer in bytes (its thresholds are bytes)")
        # One bound: what a lone busy queue holds, never above the buffer.
        if self.pause.xoff is not None and self.buffer is not None:
            held = self.held_bytes(self.buffer)
            if self.pause.xoff >= held:
                raise ValueError(
                    f"switch.pause.xoff must be below the buffer ({self.buffer} B)" if held == self.buffer else
                    f"switch.pause.xoff must be below what the pool admits a lone busy queue "
                    f"(alpha x size / (1 + alpha) = {held} B): above it frames are dropped before any "
                    "PAUSE is sent")
        if self.pause.xon is not None and self.pause.xoff is not None and self.pause.xon > self.pause.xoff:
            raise ValueError("switch.pause.xon must not be above switch.pause.xoff")
        if self.ecn is not None:
            if self.buffer is None:
                raise ValueError("switch.ecn needs switch.buffer in bytes (the threshold is bytes)")
            smallest = min(int(self.buffer * s) for s in self.qos.shares())
            if not 0 < self.ecn < smallest:
                raise ValueError(f"switch.ecn must be below every class queue's share of the buffer "
                                 f"({smallest} B)")
        return self

    def class_limits(self, mtu: int) -> list[int]:
        """Limit of each class queue: bytes (bfifo) or packets (pfifo)."""
        shares = self.qos.shares()
        if self.buffer is not None:
            limits = [int(self.buffer * s) for s in shares]
            frame = mtu + ETH_HLEN
            for c, lim in enumerate(limits):
                if lim < frame:
                    raise ValueError(
                        f"switch.buffer: class {c} gets {lim} B, less than one {frame} B frame; "
                        f"use a larger buffer or fewer queues")
            return limits
        limits = [int(self.buffer_packets * s) for s in shares]
        for c, lim in enumerate(limits):
            if lim < 1:
                raise ValueError(f"switch.buffer_packets: class {c} gets no packet; use more packets or fewer queues")
        return limits



# Sysctls a TcpSettings field (or the testbed itself) already sets: tcp.sysctls may not
# name them, so that one value never has two sources.
SYSCTLS_OWNED = {"tcp_congestion_control": "tcp.cc", "tcp_sack": "tcp.sack",
                 "tcp_reordering": "tcp.dupack_threshold",
                 "tcp_slow_start_after_idle": "tcp.slow_start_after_idle", "tcp_ecn": "tcp.ecn",
                 "tcp_rto_min_us": "tcp.rto_min", "tcp_rto_hrtimer": "tcp.hrtimer_rto",
                 "tcp_rto_random_pct": "tcp.rto_random_pct", "tcp_delack_us": "tcp.delack_us",
                 "tcp_no_metrics_save": "the testbed (every run starts without cached metrics)"}
_SYSCTL_NAME = re.compile(r"^tcp_[a-z0-9_]{1,48}$")
# Values go into a shell command in each host: digits, words and the spaces between
# a vector's numbers (tcp_rmem), nothing a shell would read.
_SYSCTL_VALUE = re.compile(r"^[A-Za-z0-9_.-]+( [A-Za-z0-9_.-]+)*$")


def _sysctl_value(value) -> str:
    """A sysctl's value as written to /proc/sys: booleans as 1/0, numbers as text."""
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value).strip()


def _check_sysctls(table: dict[str, str]) -> dict[str, str]:
    for name, value in table.items():
        if not _SYSCTL_NAME.match(name):
            raise ValueError(f"{name!r} is not a TCP sysctl of net.ipv4 (tcp_...)")
        if name in SYSCTLS_OWNED:
            raise ValueError(f"{name} is set by {SYSCTLS_OWNED[name]}; give it there")
        if not 0 < len(value) <= 64 or not _SYSCTL_VALUE.match(value):
            raise ValueError(f"{name} = {value!r}: a sysctl value is digits or a word (vectors: space-separated)")
    return table


SysctlTable = Annotated[dict[str, Annotated[str, BeforeValidator(_sysctl_value)]],
                        AfterValidator(_check_sysctls)]


class TcpSettings(_Model):
    """One TCP profile (set per network namespace)."""
    cc: str = Field("reno", pattern=r"^[a-z0-9_]{1,16}$", description="congestion control, always set explicitly")
    rto_min: RtoMin = 200_000
    delayed_ack: bool = True
    sack: bool = True
    dupack_threshold: int = Field(3, ge=1, le=300, description="net.ipv4.tcp_reordering")
    initcwnd: int | None = Field(None, ge=1, le=1000, description="segments; kernel default when unset")
    slow_start_after_idle: bool = True
    # Microsecond timers of the hrtimer kernel (kernels/); refused on a kernel without them.
    hrtimer_rto: bool | None = Field(None, description="net.ipv4.tcp_rto_hrtimer; default: on where the kernel has it")
    rto_random_pct: int = Field(0, ge=0, le=100, description="net.ipv4.tcp_rto_random_pct (50: the paper's)")
    delack_us: int = Field(0, ge=0, le=1_000_000, description="net.ipv4.tcp_delack_us; 0 = the kernel's delayed ACK")
    ecn: bool = Field(False, description="net.ipv4.tcp_ecn = 1: ask for ECN (dctcp asks anyway)")
    era: Literal[TCP_ERAS] = Field(
        "modern", description="modern: this kernel's TCP as it comes; linux-2.6.28: turned back, per "
        "namespace, to the papers' kernel where it can be (initial window 3, no tail loss probes, no "
        "RACK, ...; docs/tcp-profiles.md); linux-2.6.18: the same with F-RTO off (FAST'08's and WREN'09's "
        "kernel); tcp.initcwnd and tcp.sysctls win over it")
    sysctls: SysctlTable = Field(
        default_factory=dict, description="more net.ipv4 TCP sysctls for the namespace, by name without "
        "the net.ipv4. prefix (tcp_early_retrans = 0); they win over the era's; a profile's are "
        "merged over [tcp]'s")


def _optional(f):
    """A field's type, its validators and limits kept, with None allowed (unset)."""
    return Annotated[(Union[f.annotation, None], *f.metadata)] if f.metadata else Union[f.annotation, None]


def _profile_field(f):
    """A TcpSettings field as a named profile has it: unset by default. A table
    (tcp.sysctls) stays a table, empty by default: it adds nothing to [tcp]'s, and
    --set walks into it by key as into [tcp]'s."""
    if f.default_factory is dict:
        return Annotated[(f.annotation, *f.metadata)], Field(default_factory=dict, description=f.description)
    return _optional(f), Field(None, description=f.description)


# A named profile gives only what differs from [tcp]; the merged profile is validated
# as TcpSettings (so the same limits apply).
TcpProfileFields = create_model(
    "TcpProfileFields", __base__=_Model,
    **{name: _profile_field(f) for name, f in TcpSettings.model_fields.items()})

_PROFILE_NAME = re.compile(r"^[A-Za-z0-9_-]{1,32}$")
ROLES = ("client", "servers", "others")


class TCP(TcpSettings):
    """The hosts' TCP: every host's profile, unless ``hosts`` gives it a named one.

    ``profiles`` names profiles by the fields that differ from this table; ``hosts``
    assigns them to a role (``client``, ``servers``) or a host (``server3``); a host's
    own entry wins over its role's. The settings are per network namespace, so one
    kernel runs hosts with different profiles (SIGCOMM'09 Figure 6: microsecond-RTO
    servers and a client with or without delayed ACK)."""
    profiles: dict[str, TcpProfileFields] = Field(default_factory=dict)
    hosts: dict[str, str] = Field(default_factory=dict, description="role or host -> profile name")

    @model_validator(mode="after")
    def _profiles_resolve(self):
        for name in self.profiles:
            if not _PROFILE_NAME.match(name):
                raise ValueError(f"profiles: {name!r} is not a profile name (letters, digits, _ and -)")
            self.settings(name)     # the merged profile must be valid
        for who, name in self.hosts.items():
            if who not in ROLES and not re.fullmatch(r"(server|near|far)[1-9][0-9]*", who):
                raise ValueError(f"hosts: {who!r} is neither a role ({', '.join(ROLES)}) nor a host "
                                 "(serverN, nearN, farN)")
            if name not in self.profiles:
                known = ", ".join(self.profiles) or "none defined"
                raise ValueError(f"hosts.{who}: no profile {name!r} (profiles: {known})")
        return self

    def settings(self, profile: str | None = None) -> TcpSettings:
        """[tcp] itself (profile None), or a named profile merged over it."""
        base = {k: getattr(self, k) for k in TcpSettings.model_fields}
        if profile is None:
            return TcpSettings(**base)
        over = self.profiles[profile].model_dump(exclude_none=True)
        if "sysctls" in over:       # a profile adds sysctls to [tcp]'s, name by name
            over["sysctls"] = {**base["sysctls"], **over["sysctls"]}
        try:
            return TcpSettings(**{**base, **over})
        except ValidationError as e:
            raise ValueError(f"profiles.{profile}.{format_validation_error(e)}") from None

    def profile_of(self, host: str) -> str | None:
        """The profile name a host runs (None: [tcp] itself)."""
        if host in self.hosts:
            return self.hosts[host]
        role = ("client" if host == "client" else "servers" if host.startswith("server")
                else "others" if host.startswith(("near", "far")) else None)
        return self.hosts.get(role) if role else None

    def for_host(self, host: str) -> TcpSettings:
        """The TCP settings of a host (or of a role: ``client``, ``servers``)."""
        return self.settings(self.profile_of(host))

    def all_settings(self) -> list[tuple[str, TcpSettings]]:
        """Every profile a run may apply, labelled as in the scenario: [tcp] first."""
        return [("tcp", self.settings())] + [(f"tcp.profiles.{n}", self.settings(n)) for n in self.profiles]


class Workload(_Model):
    """What the client asks of the servers: synchronized requests, one block at a time."""
    kind: Annotated[str, _registered("workload", lambda: WORKLOADS)] = "fixed-fragment"
    sru: Size = Field(parse_size("256KiB"), description="bytes per server per block (fixed-fragment, memcached)")
    block: Size = Field(parse_size("1MiB"), description="bytes per block split over the servers (fixed-block)")
    blocks: int = Field(20, ge=1, le=1_000_000, description="measured blocks per repetition")
    warmup: int = Field(2, ge=0, le=10_000, description="unmeasured blocks first")
    repetitions: int = Field(1, ge=1, le=1000)
    seed: int = Field(1, ge=0)
    # One interpreter per server costs ~20 MB each: hundreds of servers (SIGCOMM'09 Fig
    # 13) fit only with one process holding every server's sockets, each socket made in
    # its server's namespace, so the data still leaves from that host's TCP.
    server_process: Literal["per-server", "shared"] = Field(
        "per-server", description="per-server: a server program in each host; shared: one "
        "process serves every server host's namespace (many servers; fixed-fragment/fixed-block)")

    @field_validator("sru", "block")
    @classmethod
    def _positive(cls, v):
        if v < 1:
            raise ValueError("must be at least 1 byte")
        return v

    @model_validator(mode="after")
    def _shared_server_speaks_ours(self):
        if self.server_process == "shared" and self.kind not in ("fixed-fragment", "fixed-block"):
            raise ValueError(f"workload.server_process shared: {self.kind} runs its own servers "
                             "(fixed-fragment and fixed-block share one)")
        return self

    def sizing(self) -> str:
        return WORKLOADS[self.kind].sizing

    def fragments(self, senders: int) -> list[int]:
        """Bytes each server sends per block."""
        if self.sizing() == "fragment":
            return [self.sru] * senders
        base, extra = divmod(self.block, senders)
        return [base + (1 if i < extra else 0) for i in range(senders)]


def _sample(value):
    text = str(value).strip().lower()
    if text == "all" or re.fullmatch(r"1/[1-9][0-9]*", text):
        return text
    m = re.fullmatch(r"(change|above):(.+)", text)
    if m:
        return f"{m.group(1)}:{parse_size(m.group(2))}"
    raise ValueError("use all, 1/N, change:SIZE or above:SIZE")


class Telemetry(_Model):
    enabled: bool = False
    sample: Annotated[str, BeforeValidator(_sample)] = Field(
        "all", description="which dequeues are recorded (bmv2): all, 1/N, change:SIZE, above:SIZE")
    perf_buffer_pages: int = Field(4096, ge=8, le=65536, description="per-CPU perf ring for bpftrace")
    interval: Annotated[int, BeforeValidator(parse_time_us), Field(ge=1, le=1_000_000)] = Field(
        10, description="us between samples where queues are sampled (linux data plane in virtual time)")
    capture: bool = Field(False, description="tcpdump at every server's NIC, headers only (incast explain)")

    def sample_mode(self) -> tuple[int, int]:
        """(mode, parameter) as p4src/incast.p4 reads them: 1 all, 2 one in N,
        3 on a change of SIZE bytes, 4 above SIZE bytes."""
        if self.sample == "all":
            return 1, 0
        if self.sample.startswith("1/"):
            return 2, int(self.sample[2:])
        kind, size = self.sample.split(":")
        return (3 if kind == "change" else 4), int(size)


class BackgroundFlow(_Model):
    """A long-lived bulk TCP flow running while the blocks are measured (an innocent
    bystander of the incast, or competing traffic); measured on its own."""
    src: str = Field(description="sending host, e.g. far1")
    dst: str = Field(description="receiving host, e.g. near1 or client")
    dscp: int = Field(0, ge=0, le=63, description="DSCP of its data (its class under switch.qos)")


class Scenario(_Model):
    name: str = Field("incast", pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    # A paper's testbed (testbeds/<name>.toml): its settings lie beneath the scenario's
    # own, which win over them (incast.testbed).
    testbed: Annotated[str, _registered("testbed", _testbeds)] | None = None
    dataplane: Annotated[str, _registered("data plane", _dataplanes)] = "linux"
    kernel: Literal["host", "stock", "hrtimer"] = "host"
    # real: on this machine's clock (in a QEMU VM for stock/hrtimer); virtual: inside
    # User-Mode Linux with time-travel, where links hold their rate on any machine.
    clock: Literal["real", "virtual"] = "real"
    topology: Topology = Topology()
    link: Link = Link()
    switch: Switch = Switch()
    tcp: TCP = TCP()
    workload: Workload = Workload()
    telemetry: Telemetry = Telemetry()
    background: list[BackgroundFlow] = Field(default_factory=list)


    @model_validator(mode="after")
    def _fits(self):
        self.switch.class_limits(self.link.mtu)   # raises with a clear message
        plane = DATAPLANES[self.dataplane]
        can = list(DATAPLANES)
        busiest = self.topology.most_hosts_on_a_switch()
        if busiest > plane.max_ports:
            raise ValueError(f"topology: {busiest} ports on one switch; a switch of the {self.dataplane} "
                             f"data plane takes at most {plane.max_ports}")
        clock = clocks.named(self.clock)
        if not clock.host_kernel and self.kernel == "host":
            raise ValueError(f"clock {clock.name} runs a User-Mode Linux kernel, not this machine's: "
                             f"choose kernel stock or hrtimer (built by {clock.guest_build_hint})")
        if not clock.calibrated and self.link.rate == "auto":
            raise ValueError("link.rate auto: in virtual time every rate holds; give one, e.g. --link-rate 1Gbit "
                             "(the papers' rate)")
        if self.link.rate == "auto" and not plane.calibrated:
            raise ValueError(f"link.rate auto: the {self.dataplane} data plane is not calibrated (only "
                             f"{', '.join(n for n in can if DATAPLANES[n].calibrated)}); give it an explicit rate")
        if self.switch.pause.enabled and not plane.pause:
            raise ValueError(f"switch.pause: the {self.dataplane} data plane sends no PAUSE frames "
                             f"(use dataplane {' or '.join(n for n in can if DATAPLANES[n].pause)})")
        pause = self.switch.pause
        if pause.pfc and not plane.pfc:
            raise ValueError(f"switch.pause.pfc: the {self.dataplane} data plane sends no PFC frames (use "
                             f"dataplane {' or '.join(n for n in can if DATAPLANES[n].pfc)})")
        for what, wanted in (("watchdog", pause.watchdog), ("storm", pause.storm)):
            if wanted and not plane.pause_watchdog:
                raise ValueError(f"switch.pause.{what}: the {self.dataplane} data plane has no PFC watchdog "
                                 "(use dataplane "
                                 f"{' or '.join(n for n in can if DATAPLANES[n].pause_watchdog)})")
        if pause.enabled and self.topology.trunked() and not plane.pause_rx:
            # Its PAUSE would reach the other switch over the trunk and be ignored there:
            # the run would show flow control that half its switches do not do.
            raise ValueError(f"switch.pause across switches ({self.topology.kind}): the {self.dataplane} data "
                             "plane sends PAUSE but obeys none at its ports, so a switch would never hold the "
                             f"trunk (use dataplane {' or '.join(n for n in can if DATAPLANES[n].pause_rx)}, "
                             "or topology star)")
        if self.topology.trunk_buffer is not None and (not plane.trunk_buffer or pause.enabled):
            # bmv2's limits and the PAUSE thresholds are the switch's per port; a trunk of
            # its own size is the kernel bridge's alone, without flow control.
            raise ValueError("topology.trunk_buffer: for dataplane "
                             f"{' or '.join(n for n in can if DATAPLANES[n].trunk_buffer)} without switch.pause")
        if pause.storm and pause.storm.host not in self.topology.hosts():
            raise ValueError(f"switch.pause.storm.host: no host {pause.storm.host!r} in this topology")
        if self.switch.pool is not None and not plane.shared_buffer:
            raise ValueError(f"switch.pool: the {self.dataplane} data plane has a fixed buffer per port (use "
                             f"dataplane {' or '.join(n for n in can if DATAPLANES[n].shared_buffer)})")
        if self.switch.pool is not None and self.switch.buffer is None:
            raise ValueError("switch.pool: the queues' caps must be in bytes (switch.buffer, not buffer_packets)")
        if pause.enabled and self.switch.ecn is not None:
            raise ValueError("switch.pause with switch.ecn: one at a time (a class queue either marks or pauses)")
        hosts = self.topology.hosts()
        for i, f in enumerate(self.background):
            for end in (f.src, f.dst):
                if end not in hosts:
                    raise ValueError(f"background[{i}]: no host {end!r} in this topology "
                                     f"(hosts: client, server1.., and with topology.others: near1.., far1..)")
            if f.src == f.dst:
                raise ValueError(f"background[{i}]: src and dst are the same host")
        if self.topology.trunked() and not plane.multi_switch:
            raise ValueError(f"topology {self.topology.kind}: the {self.dataplane} data plane forwards "
                             f"in a single switch only (use dataplane {' or '.join(n for n in can if DATAPLANES[n].multi_switch)})")
        if self.switch.ecn is not None and not plane.ecn:
            raise ValueError(f"switch.ecn: the {self.dataplane} data plane does not mark ECN "
                             f"(use dataplane {' or '.join(n for n in can if DATAPLANES[n].ecn)})")
        if self.switch.buffer_packets is not None and not plane.packet_buffers:
            raise ValueError(f"switch.buffer_packets: the {self.dataplane} data plane limits its queues "
                             "in bytes; give switch.buffer")
        if self.telemetry.sample != "all" and not plane.telemetry_sampling:
            raise ValueError(f"telemetry.sample: the {self.dataplane} data plane records every packet "
                             f"(sampling: {' or '.join(n for n in can if DATAPLANES[n].telemetry_sampling)})")
        if self.workload.sizing() == "block" and self.workload.block < self.topology.senders:
            raise ValueError("workload.block is smaller than one byte per server")
        if self.switch.qos.queues > 1 and not WORKLOADS[self.workload.kind].dscp:
            raise ValueError(f"switch.qos: the {self.workload.kind} workload's servers do not mark their "
                             "data with a class's DSCP; use switch.qos.queues = 1")
        return self

    def fragments(self) -> list[int]:
        return self.workload.fragments(self.topology.senders)

    def port_rate(self, trunk: bool) -> int:
        """A switch port's rate: a trunk's own (topology.trunk_rate), else the link's."""
        if trunk and self.topology.trunk_rate:
            return self.topology.trunk_rate
        return self.link.rate

    def block_bytes(self) -> int:
        return sum(self.fragments())

    def describe(self, omit: set[str] = frozenset()) -> str:
        """One line naming the scenario; `omit` drops the parts a sweep varies
        (senders, load, rate, buffer, cc, rto_min)."""
        w, s = self.workload, self.switch
        load = (f"SRU {format_size(w.sru)}" if w.sizing() == "fragment"
                else f"block {format_size(w.block)}")
        load = " ".join(p for p in (WORKLOADS[w.kind].label, load) if p)
        buf = format_size(s.buffer) if s.buffer is not None else f"{s.buffer_packets}pkt"
        rto = self.tcp.rto_min if self.tcp.rto_min == "min" else format_time_us(self.tcp.rto_min)
        default_plane = type(self).model_fields["dataplane"].default
        parts = {"dataplane": "" if self.dataplane == default_plane else f"{self.dataplane} switch",
                 "senders": f"{self.topology.senders} senders", "load": load,
                 "rate": "auto rate" if self.link.rate == "auto" else format_rate(self.link.rate),
                 "buffer": f"buffer {buf}/{s.qos.queues}q",
                 "cc": self.tcp.cc, "rto_min": f"rto_min {rto}"}
        return ", ".join(v for k, v in parts.items() if v and k not in omit)


# Short names for the fields people change most; used by --flags, --set and sweeps.
ALIASES = {
    "senders": "topology.senders",
    "testbed": "testbed",
    "sru": "workload.sru",
    "block": "workload.block",
    "blocks": "workload.blocks",
    "warmup": "workload.warmup",
    "workload": "workload.kind",
    "repetitions": "workload.repetitions",
    "seed": "workload.seed",
    "link_rate": "link.rate",
    "delay": "link.delay",
    "buffer": "switch.buffer",
    "buffer_packets": "switch.buffer_packets",
    "qos_queues": "switch.qos.queues",
    "sender_class": "switch.qos.sender_class",
    "rto_min": "tcp.rto_min",
    "cc": "tcp.cc",
    "delayed_ack": "tcp.delayed_ack",
    "sack": "tcp.sack",
    "dupack_threshold": "tcp.dupack_threshold",
    "initcwnd": "tcp.initcwnd",
    "telemetry": "telemetry.enabled",
    "capture": "telemetry.capture",
    "telemetry_sample": "telemetry.sample",
    "switch": "dataplane",
    "hrtimer_rto": "tcp.hrtimer_rto",
    "rto_random_pct": "tcp.rto_random_pct",
    "delack_us": "tcp.delack_us",
    "pause": "switch.pause.enabled",
    "xoff": "switch.pause.xoff",
    "xon": "switch.pause.xon",
    "pfc": "switch.pause.pfc",
    "ecn_threshold": "switch.ecn",
    "ecn": "tcp.ecn",
}


# Which part of Scenario.describe() each field belongs to.
DESCRIBE_PART = {"topology.senders": "senders", "workload.sru": "load", "workload.block": "load",
                 "workload.kind": "load", "link.rate": "rate", "switch.buffer": "buffer",
                 "switch.buffer_packets": "buffer", "switch.qos.queues": "buffer", "tcp.cc": "cc",
                 "tcp.rto_min": "rto_min", "dataplane": "dataplane"}


def resolve_field(name: str) -> str:
    path = ALIASES.get(name.replace("-", "_"), name)
    parts = path.split(".")
    node: Any = Scenario
    i = 0
    while i < len(parts):
        fields = getattr(node, "model_fields", None)
        if fields is None or parts[i] not in fields:
            known = ", ".join(sorted(ALIASES))
            raise ScenarioError(f"{name}: no such scenario field (short names: {known})")
        ann = fields[parts[i]].annotation
        if getattr(ann, "__origin__", None) is dict and i + 1 < len(parts):
            i += 1          # a table by key (tcp.profiles.NAME, tcp.hosts.ROLE): any key
            ann = ann.__args__[1]
        # An optional table (switch.pause.watchdog: Watchdog | None) is walked as the table.
        models = [a for a in getattr(ann, "__args__", ()) if isinstance(a, type) and issubclass(a, BaseModel)]
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            node = ann
        else:
            node = models[0] if len(models) == 1 else None
        i += 1
    return path


def _parse_cli_value(text: str):
    """A command-line value: lists with commas, "none" unsets an optional field (e.g.
    switch.pause.watchdog=none), numbers/bools left to the model's coercion."""
    if isinstance(text, str) and text.strip().lower() in ("none", "null"):
        return None
    if isinstance(text, str) and text.startswith("[") and text.endswith("]"):
        inner = text[1:-1].strip()
        return [int(x) if x.strip().lstrip("-").isdigit() else x.strip() for x in inner.split(",") if x.strip()]
    return text


def apply_overrides(data: dict, overrides: dict[str, Any]) -> dict:
    """Set dotted fields (or short aliases) in a raw scenario dict."""
    data = _deep_copy(data)
    for name, value in overrides.items():
        path = resolve_field(name).split(".")
        node = data
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ScenarioError(f"{name}: cannot set inside a non-table value")
        if path[:-1] == ["switch"]:
            keep_given_buffer_unit(node, [path[-1]])
        node[path[-1]] = _parse_cli_value(value)
    return data


def _deep_copy(d):
    if isinstance(d, dict):
        return {k: _deep_copy(v) for k, v in d.items()}
    if isinstance(d, list):
        return [_deep_copy(v) for v in d]
    return d


def format_validation_error(err: ValidationError) -> str:
    """The first problem as one line: 'field: what is wrong (got X)'."""
    e = err.errors()[0]
    loc = ".".join(str(p) for p in e["loc"] if not str(p).startswith(("function-", "int", "literal", "union")))
    msg = e["msg"]
    for prefix in ("Value error, ", "Assertion failed, "):
        if msg.startswith(prefix):
            msg = msg[len(prefix):]
    got = e.get("input")
    show_got = e["type"] not in ("value_error", "missing") and not isinstance(got, dict)
    line = f"{loc}: {msg}" if loc else msg
    if show_got:
        line += f" (got {got!r})"
    more = len(err.errors()) - 1
    if more:
        line += f" [+{more} more problem{'s' if more > 1 else ''}]"
    return line


def load_file(path: str | Path) -> dict:
    p = Path(path)
    if not p.is_file():
        raise ScenarioError(f"{path}: no such scenario file")
    try:
        data = tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ScenarioError(f"{path}: not valid TOML: {e}") from None
    data.pop("sweep", None)  # a sweep file's grid is read by the sweep driver
    return data


def build(data: dict | None = None, overrides: dict[str, Any] | None = None) -> Scenario:
    """Validate raw data (+ overrides) into a Scenario, or raise ScenarioError. A
    testbed the data names puts its settings beneath the data's."""
    data = apply_overrides(data or {}, overrides or {})
    if data.get("testbed"):
        if data["testbed"] not in testbed.known():
            raise ScenarioError(f"testbed: unknown testbed {data['testbed']!r}; one of: "
                                f"{', '.join(testbed.known())}")
        data = testbed.under(data, apply_overrides({}, testbed.overrides(data["testbed"])))
    try:
        return Scenario.model_validate(data)
    except ValidationError as e:
        raise ScenarioError(format_validation_error(e)) from None


def to_toml(scenario: Scenario) -> str:
    """The resolved scenario as TOML, in canonical units (bytes, bit/s, µs)."""
    def emit(prefix: str, d: dict, out: list[str]):
        def table_list(v):
            return isinstance(v, list) and v and all(isinstance(x, dict) for x in v)
        scalars = {k: v for k, v in d.items() if not isinstance(v, dict) and not table_list(v)}
        tables = {k: v for k, v in d.items() if isinstance(v, dict) and v and k != "dscp_map"}
        arrays = {k: v for k, v in d.items() if table_list(v)}
        if prefix:
            out.append(f"\n[{prefix}]")
        for k, v in scalars.items():
            if v is None:
                continue
            out.append(f"{k} = {_toml_value(v)}")
        if "dscp_map" in d and d["dscp_map"] is not None:
            out.append("dscp_map = { " + ", ".join(f"{k} = {v}" for k, v in d["dscp_map"].items()) + " }")
        for k, v in tables.items():
            emit(f"{prefix}.{k}" if prefix else k, v, out)
        for k, items in arrays.items():     # [[background]]: an array of tables
            for item in items:
                out.append(f"\n[[{prefix + '.' + k if prefix else k}]]")
                out += [f"{ik} = {_toml_value(iv)}" for ik, iv in item.items() if iv is not None]
    out: list[str] = ["# resolved scenario: sizes in bytes, rates in bit/s, times in µs"]
    emit("", scenario.model_dump(), out)
    return "\n".join(out) + "\n"


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return repr(v)
