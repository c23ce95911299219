// A first-word-fall-through FIFO on a memory with a synchronous read port, so that
// synthesis maps the storage to block RAM. Two output registers hide the read
// latency: `dout` is the oldest entry whenever `valid`, and one entry can be pushed
// and one popped every cycle. Capacity: 2**AW entries in the memory plus two.
module sync_fifo #(
    parameter int W = 8,
    parameter int AW = 4
) (
    input  logic         clk,
    input  logic         rst,
    input  logic         push,
    input  logic [W-1:0] din,
    input  logic         pop,     // only when valid
    output logic [W-1:0] dout,
    output logic         valid,
    output logic         full,    // push would be lost
    output logic [AW:0]  count    // entries held (saturates at 2**AW)
);
    localparam int DEPTH = 1 << AW;

    logic [W-1:0] mem [DEPTH];
    logic [AW:0]  wp, rp;          // memory write and read pointers (one wrap bit)
    logic [W-1:0] rdata;           // memory output, valid the cycle after a read
    logic         rd_inflight;
    logic [W-1:0] q0, q1;          // output stage: q0 is the head
    logic [1:0]   nq;              // entries in the output stage

    wire [AW:0] in_mem = wp - rp;
    wire        do_pop = pop && valid;
    // Entries in the output stage next cycle, before a read issued now lands.
    wire [1:0]  nq_after = nq - {1'b0, do_pop} + {1'b0, rd_inflight};
    wire        do_read = (in_mem != 0) && (nq_after != 2'd2);

    assign full = in_mem == DEPTH[AW:0];
    assign valid = nq != 0;
    assign dout = q0;
    wire [AW+1:0] total = {1'b0, in_mem} + {{AW{1'b0}}, nq} + {{AW+1{1'b0}}, rd_inflight};
    assign count = total > {1'b0, DEPTH[AW:0]} ? DEPTH[AW:0] : total[AW:0];

    always_ff @(posedge clk) begin
        if (push && !full) mem[wp[AW-1:0]] <= din;
        if (do_read) rdata <= mem[rp[AW-1:0]];
    end

    always_ff @(posedge clk) begin
        if (rst) begin
            wp <= '0;
            rp <= '0;
            rd_inflight <= 1'b0;
            nq <= '0;
        end else begin
            if (push && !full) wp <= wp + 1'b1;
            if (do_read) rp <= rp + 1'b1;
            rd_inflight <= do_read;
            nq <= nq_after;
        end
    end
    // Shift out the head, then append what the memory returned. (q0 and q1 in blocks of
    // their own: in simulation a register that the block writing it also reads is copied
    // to and from a shadow every cycle, and q1 may be hundreds of bits wide.)
    always_ff @(posedge clk)
        if (rst) q0 <= '0;
        else if (rd_inflight && nq - {1'b0, do_pop} == 2'd0) q0 <= rdata;
        else if (do_pop) q0 <= q1;
    always_ff @(posedge clk)
        if (rst) q1 <= '0;
        else if (rd_inflight && nq - {1'b0, do_pop} != 2'd0) q1 <= rdata;
endmodule
