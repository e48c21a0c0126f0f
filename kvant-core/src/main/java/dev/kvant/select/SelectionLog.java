package dev.kvant.select;

import dev.kvant.model.ModelConfig;

import java.io.BufferedWriter;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.AtomicMoveNotSupportedException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.util.ArrayList;
import java.util.List;

/**
 * Recorded selections ({@code --dump-selection FILE}), and their replay input. A text file:
 * <pre>
 * kvant-selection v1 layers=8 heads=4 kv_heads=2 head_dim_k=128 head_dim_v=128 block_tokens=16
 * LAYER POSITION TOKENS|b b b ...|b b b ...
 * </pre>
 * one line per (layer, query block) of every selected attention call, in the order they ran: the query block's
 * first position, its number of queries, then per kv head the ascending selected block indices.
 *
 * @param entries every recorded (layer, query block)
 */
public record SelectionLog(Header header, List<Entry> entries) {
    private static final String MAGIC = "kvant-selection v1";

    /**
     * The geometry the selections were made for: a model's ({@link ModelConfig}'s bounds: heads times a head size
     * within {@link ModelConfig#MAX_WIDTH}, so a replay's query and output arrays fit an int) and a selection's
     * block size ({@link SelectionConfig#blockTokens}).
     */
    public record Header(int layers, int heads, int kvHeads, int headDimK, int headDimV, int blockTokens) {
        public Header {
            if (layers < 1 || heads < 1 || kvHeads < 1 || headDimK < 1 || headDimV < 1 || blockTokens < 1) {
                throw new IllegalArgumentException("every header count must be at least 1: " + line(layers, heads,
                        kvHeads, headDimK, headDimV, blockTokens));
            }
            if (heads % kvHeads != 0) {
                throw new IllegalArgumentException("heads=" + heads + " is not a multiple of kv_heads=" + kvHeads);
            }
            if ((long) heads * Math.max(headDimK, headDimV) > ModelConfig.MAX_WIDTH) {
                throw new IllegalArgumentException("heads=" + heads + " x head_dim_k=" + headDimK + " / head_dim_v="
                        + headDimV + " makes a layer wider than " + ModelConfig.MAX_WIDTH + " values");
            }
            if (blockTokens < 16 || blockTokens > 1024 || Integer.bitCount(blockTokens) != 1) {
                throw new IllegalArgumentException("block_tokens=" + blockTokens + " is not a selection page (a power"
                        + " of two from 16 to 1024)");
            }
        }

        private static String line(int layers, int heads, int kvHeads, int headDimK, int headDimV, int blockTokens) {
            return MAGIC + " layers=" + layers + " heads=" + heads + " kv_heads=" + kvHeads + " head_dim_k="
                    + headDimK + " head_dim_v=" + headDimV + " block_tokens=" + blockTokens;
        }

        String line() {
            return MAGIC + " layers=" + layers + " heads=" + heads + " kv_heads=" + kvHeads + " head_dim_k="
                    + headDimK + " head_dim_v=" + headDimV + " block_tokens=" + blockTokens;
        }
    }

    /** The selection of one query block: blocks[g] is kv head g's list. */
    public record Entry(int layer, int position, int tokens, int[][] blocks) {
        /** As a selection for an attention call of these tokens at this position. */
        public Selection toSelection(int blockTokens) {
            return Selection.of(blockTokens, position, tokens, new int[][][] {blocks});
        }
    }

    /**
     * Writes selections as they are made, into a temporary file beside the target ({@code NAME.*.partial}) that
     * {@link #commit} moves into place once the run is over: a run that fails or is stopped, or a commit that cannot
     * move it, leaves whatever was at the target as it was (and no partial file). A target that exists and is not a
     * regular file (a directory) is refused when the writer opens, before the run. Thread-safe.
     */
    public static final class Writer implements AutoCloseable {
        private final Path path;
        private final Path partial;
        private final BufferedWriter out;
        private final Header header;
        private boolean done;

        private Writer(Path path, Header header) {
            this.path = path;
            this.header = header;
            if (Files.exists(path) && !Files.isRegularFile(path)) {
                // the move would fail after the whole run (or replace an empty directory)
                throw new IllegalArgumentException("selection dump " + path + " is " + (Files.isDirectory(path)
                        ? "a directory" : "not a regular file") + ": name a file to write");
            }
            try {
                // a name of its own beside the target: two runs dumping to one name do not share it
                Path dir = path.toAbsolutePath().getParent();
                this.partial = Files.createTempFile(dir, path.getFileName() + ".", ".partial");
                this.out = Files.newBufferedWriter(partial, StandardCharsets.UTF_8);
                out.write(header.line());
                out.newLine();
            } catch (IOException e) {
                throw new UncheckedIOException("cannot write selection dump " + path + ": " + e.getMessage(), e);
            }
        }

        public Header header() {
            return header;
        }

        /** Records every query block of a selection made for a layer. */
        public synchronized void record(int layer, Selection sel) {
            StringBuilder sb = new StringBuilder();
            int[] blocks = sel.blocks();
            for (int qb = 0; qb < sel.queryBlocks(); qb++) {
                int t0 = qb * Selection.QUERY_BLOCK;
                sb.setLength(0);
                sb.append(layer).append(' ').append(sel.start() + t0).append(' ')
                        .append(Math.min(Selection.QUERY_BLOCK, sel.n() - t0));
                for (int g = 0; g < sel.kvHeads(); g++) {
                    sb.append('|');
                    int o = sel.offset(qb, g);
                    for (int i = 0; i < sel.count(qb, g); i++) {
                        if (i > 0) {
                            sb.append(' ');
                        }
                        sb.append(blocks[o + i]);
                    }
                }
                try {
                    out.write(sb.toString());
                    out.newLine();
                } catch (IOException e) {
                    throw new UncheckedIOException("cannot write selection dump " + path + ": " + e.getMessage(), e);
                }
            }
        }

        /** The run is over: the dump goes into place (replacing what was there). */
        public synchronized void commit() {
            if (done) {
                return;
            }
            done = true;   // whatever happens below, close() has nothing left to do
            try {
                out.close();
                try {
                    Files.move(partial, path, StandardCopyOption.ATOMIC_MOVE, StandardCopyOption.REPLACE_EXISTING);
                } catch (AtomicMoveNotSupportedException e) {
                    Files.move(partial, path, StandardCopyOption.REPLACE_EXISTING);
                }
            } catch (IOException e) {
                dropPartial(e);
                throw new UncheckedIOException("cannot write selection dump " + path + ": " + e.getMessage(), e);
            } catch (RuntimeException e) {
                dropPartial(e);
                throw e;
            }
        }

        private void dropPartial(Exception cause) {
            try {
                Files.deleteIfExists(partial);
            } catch (IOException | RuntimeException e) {
                cause.addSuppressed(e);
            }
        }

        /** Without {@link #commit} first: drops what was recorded, leaving the target as it was. */
        @Override
        public synchronized void close() {
            if (done) {
                return;
            }
            done = true;
            try {
                out.close();
            } catch (IOException e) {
                dropPartial(e);
                throw new UncheckedIOException("cannot close selection dump " + path + ": " + e.getMessage(), e);
            }
            try {
                Files.deleteIfExists(partial);
            } catch (IOException e) {
                throw new UncheckedIOException("cannot close selection dump " + path + ": " + e.getMessage(), e);
            }
        }
    }

    public static Writer writer(Path path, Header header) {
        return new Writer(path, header);
    }

    /** Reads a dump, naming the file and line of anything malformed. */
    public static SelectionLog read(Path path) {
        List<String> lines;
        try {
            lines = Files.readAllLines(path, StandardCharsets.UTF_8);
        } catch (IOException e) {
            throw new UncheckedIOException("cannot read selection dump " + path + ": " + e.getMessage(), e);
        }
        if (lines.isEmpty() || !lines.get(0).startsWith(MAGIC)) {
            throw new IllegalArgumentException(path + " is not a selection dump: the first line must start with '"
                    + MAGIC + "'");
        }
        Header h;
        try {
            h = new Header(field(lines.get(0), "layers"), field(lines.get(0), "heads"), field(lines.get(0), "kv_heads"),
                    field(lines.get(0), "head_dim_k"), field(lines.get(0), "head_dim_v"),
                    field(lines.get(0), "block_tokens"));
        } catch (RuntimeException e) {
            throw new IllegalArgumentException(path + ", line 1: " + e.getMessage(), e);
        }
        List<Entry> entries = new ArrayList<>();
        for (int i = 1; i < lines.size(); i++) {
            String line = lines.get(i).strip();
            if (line.isEmpty()) {
                continue;
            }
            try {
                String[] parts = line.split("\\|", -1);
                if (parts.length != h.kvHeads() + 1) {
                    throw new IllegalArgumentException("expected " + h.kvHeads() + " kv head lists, found "
                            + (parts.length - 1));
                }
                String[] lead = parts[0].trim().split("\\s+");
                if (lead.length != 3) {
                    throw new IllegalArgumentException("expected 'LAYER POSITION TOKENS' before the first '|'");
                }
                int[][] blocks = new int[h.kvHeads()][];
                for (int g = 0; g < h.kvHeads(); g++) {
                    String p = parts[g + 1].trim();
                    blocks[g] = p.isEmpty() ? new int[0]
                            : java.util.Arrays.stream(p.split("\\s+")).mapToInt(Integer::parseInt).toArray();
                }
                int layer = Integer.parseInt(lead[0]), position = Integer.parseInt(lead[1]);
                int tokens = Integer.parseInt(lead[2]);
                if (layer < 0 || layer >= h.layers() || position < 0 || tokens < 1
                        || (long) position + tokens > Integer.MAX_VALUE) {
                    throw new IllegalArgumentException("layer " + layer + ", position " + position + ", tokens " + tokens
                            + " do not fit the header's " + h.layers() + " layers and an int context");
                }
                // the lists as a replay's attention takes them: a bad one is named here, with its line
                Selection.checkQueryBlock(h.blockTokens(), position, tokens, blocks);
                entries.add(new Entry(layer, position, tokens, blocks));
            } catch (RuntimeException e) {
                throw new IllegalArgumentException(path + ", line " + (i + 1) + ": " + e.getMessage(), e);
            }
        }
        return new SelectionLog(h, List.copyOf(entries));
    }

    private static int field(String line, String name) {
        for (String tok : line.split("\\s+")) {
            if (tok.startsWith(name + "=")) {
                return Integer.parseInt(tok.substring(name.length() + 1));
            }
        }
        throw new IllegalArgumentException("header lacks " + name + "=N");
    }
}
