package dev.kvant.kv;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvant.kv.KvLayerPlan.Change;
import dev.kvant.kv.KvLayerPlan.Scored;
import dev.kvant.kv.KvLayerPlan.Side;
import dev.kvant.kv.KvLayerPlan.Trade;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.Test;

/** The per-layer trades of {@code kvant kv-plan}: the changes to score, the pairing, the formats that result. */
class KvLayerPlanTest {
    private static final KvFormat T2 = KvFormat.parse("turbo2");
    private static final KvFormat T3 = KvFormat.parse("turbo3");
    private static final KvFormat T4 = KvFormat.parse("turbo4");
    private static final KvFormat T2M = KvFormat.parse("turbo2+mean");
    private static final KvFormat T3M = KvFormat.parse("turbo3+mean");
    private static final KvFormat T4M = KvFormat.parse("turbo4+mean");
    private static final KvFormat Q8 = KvFormat.parse("q8_0");

    @Test
    void theLadderIsTurbo2To4AndKeepsPageMeans() {
        assertEquals(T4, KvLayerPlan.step(T3, 1));
        assertEquals(T2, KvLayerPlan.step(T3, -1));
        assertEquals(T4M, KvLayerPlan.step(T3M, 1));
        assertEquals(T2M, KvLayerPlan.step(T3M, -1));
        assertNull(KvLayerPlan.step(T4, 1));
        assertNull(KvLayerPlan.step(T2M, -1));
        assertNull(KvLayerPlan.step(Q8, 1));
        assertThrows(IllegalArgumentException.class, () -> KvLayerPlan.step(T3, 2));
    }

    /** Every layer's K then V, richer then leaner, where the ladder has the step; each step is 16 bytes a block. */
    @Test
    void probesAreEachLayersKAndVOneStepEachWay() {
        KvLayerFormats f = KvLayerFormats.of(T3M, T3).withV(-1, T4).withK(0, Q8);
        List<Change> p = KvLayerPlan.probes(f, 3, 2, 128, 128);
        List<String> got = p.stream()
                .map(c -> c.layer() + "" + c.side() + ":" + c.to().name() + ":" + c.bytesPerToken()).toList();
        assertEquals(List.of(
                "0V:turbo4:32", "0V:turbo2:-32",
                "1K:turbo4+mean:32", "1K:turbo2+mean:-32", "1V:turbo4:32", "1V:turbo2:-32",
                "2K:turbo4+mean:32", "2K:turbo2+mean:-32", "2V:turbo3:-32"), got);
        // a change replaces what the layer had, by index or from the end, and the bytes follow
        Change last = p.get(8);
        KvLayerFormats changed = last.applyTo(f, 3);
        assertEquals(T3, changed.v(2, 3));
        changed.check(3);
        assertEquals(KvCache.bytesPerToken(new KvGeometry(3, 2, 128, 128), f) - 32,
                KvCache.bytesPerToken(new KvGeometry(3, 2, 128, 128), changed));
    }

    /**
     * The best gain pairs with the cheapest loss of the opposite bytes while the pair's gain, chunk by chunk, stands
     * more than z standard errors above zero; each layer's K or V trades once; the resulting formats keep the bytes.
     */
    @Test
    void gainsPairWithTheCheapestLossesWhileTheyStandClearOfTheNoise() {
        KvLayerFormats f = KvLayerFormats.of(T3M, T3);
        int layers = 4;
        List<Change> probes = KvLayerPlan.probes(f, layers, 2, 128, 128);
        double[] base = {2.00, 2.10, 1.90, 2.05};
        List<Scored> scored = new ArrayList<>();
        for (Change c : probes) {
            // layer 3 gains much from richer rows, layer 2's K a little (noisily); layer 0 loses little from leaner
            // rows, the others much
            double shift;
            if (c.richer()) {
                shift = c.layer() == 3 ? -0.05 : c.layer() == 2 && c.side() == Side.K ? -0.012 : -0.001;
            } else {
                shift = c.layer() == 0 ? (c.side() == Side.K ? 0.002 : 0.004) : 0.03;
            }
            double[] nll = base.clone();
            for (int i = 0; i < nll.length; i++) {
                // layer 2 K's gain swings with the chunk: a mean gain, but not clear of its noise
                boolean swings = c.layer() == 2 && c.side() == Side.K && c.richer();
                nll[i] += shift + (swings ? (i % 2 == 0 ? 0.03 : -0.03) : 0);
            }
            scored.add(new Scored(c, nll));
        }
        List<Trade> trades = KvLayerPlan.plan(base, scored, 2);
        List<String> got = trades.stream().map(t -> t.richer().change().option() + " / " + t.leaner().change().option())
                .toList();
        // layer 3's K and V gain 0.05; layer 0's K costs 0.002, its V 0.004: two trades, then layer 2 K's noisy
        // 0.012 against a cost of 0.03 does not pay
        assertEquals(List.of("--ctk-layer 3=turbo4+mean / --ctk-layer 0=turbo2+mean",
                "--ctv-layer 3=turbo4 / --ctv-layer 0=turbo2"), got);
        assertEquals(0.048, trades.get(0).meanGain(), 1e-12);
        assertEquals(0, trades.get(0).gainError(), 1e-12);
        KvLayerFormats plan = KvLayerPlan.apply(f, trades, layers);
        KvGeometry g = new KvGeometry(layers, 2, 128, 128);
        assertEquals(KvCache.bytesPerToken(g, f), KvCache.bytesPerToken(g, plan));
        assertEquals(T4M, plan.k(3, layers));
        assertEquals(T2M, plan.k(0, layers));
        assertEquals(T4, plan.v(3, layers));
        assertEquals(T2, plan.v(0, layers));
        assertEquals(T3M, plan.k(1, layers));

        // a gain that swings chunk by chunk (layer 1's K richer: -0.05, +0.03, ...; layer 0's K leaner +0.001, every
        // other change worse) is not taken at z = 2, and is at z = 0
        List<Scored> noisy = new ArrayList<>();
        for (Change c : probes) {
            double[] nll = base.clone();
            for (int i = 0; i < nll.length; i++) {
                if (c.layer() == 1 && c.side() == Side.K && c.richer()) {
                    nll[i] += i % 2 == 0 ? -0.05 : 0.03;
                } else if (c.layer() == 0 && c.side() == Side.K && !c.richer()) {
                    nll[i] += 0.001;
                } else {
                    nll[i] += c.richer() ? 0.01 : 0.02;
                }
            }
            noisy.add(new Scored(c, nll));
        }
        assertTrue(KvLayerPlan.plan(base, noisy, 2).isEmpty());
        List<Trade> any = KvLayerPlan.plan(base, noisy, 0);
        assertEquals(1, any.size());
        assertEquals("--ctk-layer 1=turbo4+mean", any.get(0).richer().change().option());
    }

    @Test
    void plansNeedTwoChunksAndOneChunkCountForAll() {
        KvLayerFormats f = KvLayerFormats.of(T3, T3);
        List<Change> probes = KvLayerPlan.probes(f, 2, 1, 128, 128);
        List<Scored> scored = probes.stream().map(c -> new Scored(c, new double[] {1, 2})).toList();
        assertThrows(IllegalArgumentException.class, () -> KvLayerPlan.plan(new double[] {1}, List.of(), 2));
        assertThrows(IllegalArgumentException.class, () -> KvLayerPlan.plan(new double[] {1, 2, 3}, scored, 2));
        assertThrows(IllegalArgumentException.class, () -> KvLayerPlan.plan(new double[] {1, 2}, scored, -1));
        assertTrue(KvLayerPlan.plan(new double[] {1, 2}, scored, 2).isEmpty());
    }
}
