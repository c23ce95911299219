// Verilator options and sources of the switch (verilator -f rtl/verilator.f ...).
// Per-queue arrays are reset and updated in loops over all queues: let Verilator
// unroll them at 48 ports (384 queues) too.
--unroll-count 4096
--unroll-stmts 100000
-Irtl/src
rtl/src/sync_fifo.sv
rtl/src/port_rx.sv
rtl/src/port_tx.sv
rtl/src/incast_switch.sv
