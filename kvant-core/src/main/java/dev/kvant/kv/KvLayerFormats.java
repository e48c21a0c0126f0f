package dev.kvant.kv;

import java.util.Map;
import java.util.TreeMap;

/**
 * The K and V formats of every layer of a cache: {@code k} and {@code v} for all layers but those given their own
 * ({@code --ctk-layer}, {@code --ctv-layer}). A layer is named by its index, or by a negative index counted from the
 * end (-1 the last layer), so one setting fits models of any depth. The outer layers carry most of a compressed
 * cache's loss (docs/KV_FORMATS.md): {@code turbo3} with the last layer at {@code q8_0} is the intended use.
 *
 * @param kLayers K formats of single layers (index or negative index from the end), in place of {@code k}
 * @param vLayers V formats of single layers, in place of {@code v}
 */
public record KvLayerFormats(KvFormat k, KvFormat v, Map<Integer, KvFormat> kLayers, Map<Integer, KvFormat> vLayers) {
    public KvLayerFormats {
        if (k == null || v == null) {
            throw new IllegalArgumentException("a cache needs a K and a V format");
        }
        kLayers = Map.copyOf(kLayers);
        vLayers = Map.copyOf(vLayers);
    }

    /** One K and one V format for every layer. */
    public static KvLayerFormats of(KvFormat k, KvFormat v) {
        return new KvLayerFormats(k, v, Map.of(), Map.of());
    }

    /**
     * These formats with layer's K rows in f ({@code layer} < 0 counts from the end).
     *
     * @throws IllegalArgumentException when that layer already has another K format of its own
     */
    public KvLayerFormats withK(int layer, KvFormat f) {
        return new KvLayerFormats(k, v, with("K", kLayers, layer, f), vLayers);
    }

    /**
     * These formats with layer's V rows in f ({@code layer} < 0 counts from the end).
     *
     * @throws IllegalArgumentException when that layer already has another V format of its own
     */
    public KvLayerFormats withV(int layer, KvFormat f) {
        return new KvLayerFormats(k, v, kLayers, with("V", vLayers, layer, f));
    }

    private static Map<Integer, KvFormat> with(String what, Map<Integer, KvFormat> layerFormats, int layer,
                                               KvFormat f) {
        KvFormat before = layerFormats.get(layer);
        if (before != null && !before.equals(f)) {
            throw new IllegalArgumentException(what + " formats " + before.name() + " and " + f.name()
                    + " both given for layer " + layer);
        }
        Map<Integer, KvFormat> m = new TreeMap<>(layerFormats);
        m.put(layer, f);
        return m;
    }

    /** The K format of layer (0 <= layer < layers). */
    public KvFormat k(int layer, int layers) {
        return pick(kLayers, k, layer, layers);
    }

    /** The V format of layer (0 <= layer < layers). */
    public KvFormat v(int layer, int layers) {
        return pick(vLayers, v, layer, layers);
    }

    /** Whether some layer of a model of {@code layers} layers centers its keys on their page's mean. */
    public boolean anyKeyMeans(int layers) {
        for (int l = 0; l < layers; l++) {
            if (k(l, layers) instanceof PageMeanFormat) {
                return true;
            }
        }
        return false;
    }

    /** Whether every layer of a model of {@code layers} layers has the same K format and the same V format. */
    public boolean uniform(int layers) {
        check(layers);
        for (int l = 1; l < layers; l++) {
            if (!k(l, layers).equals(k(0, layers)) || !v(l, layers).equals(v(0, layers))) {
                return false;
            }
        }
        return true;
    }

    /**
     * The number of values a head of {@code headDimK} takes in the K domain of every layer (key summaries keep one
     * size for all layers).
     *
     * @throws IllegalArgumentException when two layers' K formats hold such a head in different sizes (a rotated
     *                                  format pads a head that is no multiple of 64)
     */
    public int keyDomainDim(int headDimK, int layers) {
        check(layers);
        int dim = k(0, layers).domainDim(headDimK);
        for (int l = 1; l < layers; l++) {
            KvFormat f = k(l, layers);
            if (f.domainDim(headDimK) != dim) {
                throw new IllegalArgumentException("key summaries (--select) need one key size in every layer; K "
                        + "formats " + k(0, layers).name() + " and " + f.name() + " hold heads of " + headDimK
                        + " as " + dim + " and " + f.domainDim(headDimK) + " values");
            }
        }
        return dim;
    }

    /**
     * Checks the layer indices against a model of {@code layers} layers: each in [-layers, layers), and no layer
     * named twice (once by index, once from the end) with two formats.
     */
    public void check(int layers) {
        check("K", kLayers, layers);
        check("V", vLayers, layers);
    }

    /** "k/v", then each layer of its own, e.g. {@code turbo3/turbo3, layer -1: q8_0/q8_0}. */
    public String name() {
        StringBuilder s = new StringBuilder(k.name()).append('/').append(v.name());
        TreeMap<Integer, String[]> layers = new TreeMap<>();
        kLayers.forEach((l, f) -> layers.computeIfAbsent(l, x -> new String[2])[0] = f.name());
        vLayers.forEach((l, f) -> layers.computeIfAbsent(l, x -> new String[2])[1] = f.name());
        layers.forEach((l, f) -> s.append(", layer ").append(l).append(": ").append(f[0] == null ? k.name() : f[0])
                .append('/').append(f[1] == null ? v.name() : f[1]));
        return s.toString();
    }

    private static KvFormat pick(Map<Integer, KvFormat> layerFormats, KvFormat all, int layer, int layers) {
        if (layer < 0 || layer >= layers) {
            throw new IndexOutOfBoundsException("layer " + layer + " of " + layers);
        }
        KvFormat f = layerFormats.get(layer);
        return f != null ? f : layerFormats.getOrDefault(layer - layers, all);
    }

    private static void check(String what, Map<Integer, KvFormat> layerFormats, int layers) {
        for (Map.Entry<Integer, KvFormat> e : layerFormats.entrySet()) {
            int l = e.getKey();
            if (l < -layers || l >= layers) {
                throw new IllegalArgumentException(what + " format for layer " + l + ": the model has " + layers
                        + " layers (0.." + (layers - 1) + ", or -1..-" + layers + " from the end)");
            }
            KvFormat other = layerFormats.get(l < 0 ? l + layers : l - layers);
            if (other != null && !other.equals(e.getValue())) {
                int index = l < 0 ? l + layers : l;
                throw new IllegalArgumentException(what + " formats " + e.getValue().name() + " and " + other.name()
                        + " both given for layer " + index + " (as " + index + " and " + (index - layers) + ")");
            }
        }
    }
}
