package dev.kvant.server;

import java.util.Locale;
import java.util.concurrent.atomic.DoubleAdder;
import java.util.concurrent.atomic.LongAdder;

/** A Prometheus histogram of seconds with fixed upper bounds; safe to observe from many threads. */
final class Histogram {
    private final String name;
    private final String help;
    private final double[] bounds;
    private final LongAdder[] buckets;
    private final LongAdder count = new LongAdder();
    private final DoubleAdder sum = new DoubleAdder();

    Histogram(String name, String help, double... bounds) {
        this.name = name;
        this.help = help;
        this.bounds = bounds.clone();
        this.buckets = new LongAdder[bounds.length];
        for (int i = 0; i < bounds.length; i++) {
            buckets[i] = new LongAdder();
        }
    }

    void observe(double seconds) {
        for (int i = 0; i < bounds.length; i++) {
            if (seconds <= bounds[i]) {
                buckets[i].increment();
                break;
            }
        }
        count.increment();
        sum.add(seconds);
    }

    long count() {
        return count.sum();
    }

    /** The exposition lines; bucket counts are cumulative as the format wants. */
    void write(StringBuilder sb) {
        sb.append("# HELP ").append(name).append(' ').append(help).append('\n');
        sb.append("# TYPE ").append(name).append(" histogram\n");
        long cumulative = 0;
        for (int i = 0; i < bounds.length; i++) {
            cumulative += buckets[i].sum();
            sb.append(name).append("_bucket{le=\"").append(java.math.BigDecimal.valueOf(bounds[i]).stripTrailingZeros().toPlainString())
                    .append("\"} ").append(cumulative).append('\n');
        }
        long total = Math.max(cumulative, count.sum());
        sb.append(name).append("_bucket{le=\"+Inf\"} ").append(total).append('\n');
        sb.append(name).append("_sum ").append(String.format(Locale.ROOT, "%.6f", sum.sum())).append('\n');
        sb.append(name).append("_count ").append(total).append('\n');
    }
}
