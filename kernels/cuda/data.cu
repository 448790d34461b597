// Batches gathered on the device from the resident dataset, and the per-env sums a training epoch and
// a validation pass keep: the CUDA twins of Batcher::fill_train (with Augment::apply), Batcher::fill_test
// (kernels/src/data/shard.rs, augment.rs) and of the sums in CpuHostBackend::train_epoch and
// accumulate_validation (kernels/src/host/backend.rs, train.rs). Images are [N, C, H, W] f32, batches
// [E, B, C, H, W], labels u8.

#define PAD_LABEL 255

// Training batch slot t = e·B + i is training image index[t], cropped and flipped by draw[t]
// (AugDraw::pack: top | left << 8 | flip << 16): out[t][c][y][x] = padded[c][y + top][x' + left] with
// x' = W−1−x when flipped, padded = the image surrounded by `pad` pixels of fill[c]. With pad 0 and
// draw 0 this is a copy. A copy or a fill: the same bits as the CPU.
//
// A thread takes RUN consecutive elements of a row at a time (RUN = 4 where the width allows it and
// LOADS_AHEAD, else 1): their slot's draw and index are loaded once, and their RUN image loads issue
// together. One element at a time, the image load waited on the index load and the next element's loads
// on this one's store, so a thread had one load in flight (SASS).
template <u32 RUN>
__device__ __forceinline__ void gather_train_runs(
    const float* images, const u8* labels, const u32* index, const u32* draw, const float* fill, float* out,
    u8* out_labels, u32 slots, u32 channels, u32 height, u32 width, u32 pad, bool fits, const FastDiv (&f)[3]) {
    u64 plane = (u64)height * width, image_len = channels * plane;
    FOR_EACH(run, (u64)slots * image_len / RUN) {
        u64 i = run * RUN, t, r;
        u32 c, y, x;
        if (fits) {
            u32 slot = fdiv((u32)i, f[0]), rr = (u32)i - slot * (u32)image_len;
            u32 cc = fdiv(rr, f[1]), q = rr - cc * (u32)plane, yy = fdiv(q, f[2]);
            t = slot, r = rr, c = cc, y = yy, x = q - yy * width;
        } else {
            t = i / image_len, r = i % image_len;
            c = (u32)(r / plane), y = (u32)(r % plane / width), x = (u32)(r % width);
        }
        u32 d = draw[t], source = index[t];
        int top = (int)(d & 0xffu), left = (int)((d >> 8) & 0xffu);
        bool flip = ((d >> 16) & 1u) != 0;
        int sy = (int)y + top - (int)pad;
        bool row_inside = sy >= 0 && sy < (int)height;
        const float* row = images + (u64)source * image_len + c * plane + (u64)(row_inside ? sy : 0) * width;
        float fill_c = fill[c], v[RUN];
#pragma unroll
        for (u32 j = 0; j < RUN; ++j) {
            int xc = flip ? (int)width - 1 - (int)(x + j) : (int)(x + j);
            int sx = xc + left - (int)pad;
            v[j] = row_inside && sx >= 0 && sx < (int)width ? row[sx] : fill_c;
        }
#pragma unroll
        for (u32 j = 0; j < RUN; ++j) out[i + j] = v[j];
        if (r == 0) out_labels[t] = labels[source];
    }
}

extern "C" __global__ void gather_train_f32(
    const float* images, const u8* labels, const u32* index, const u32* draw, const float* fill, float* out,
    u8* out_labels, u32 slots, u32 channels, u32 height, u32 width, u32 pad) {
    u64 plane = (u64)height * width, image_len = channels * plane;
    // An element's slot, channel, row and column through the block's FastDivs where every index fits in
    // 32 bits (six divisions an element, the 64-bit ones called routines, had been most of the kernel).
    bool fits = FITS_U32((u64)slots * image_len);
    FastDiv f[3];
    block_fast_divs<3>({fits ? (u32)image_len : 1u, fits ? (u32)plane : 1u, width}, f);
    if (LOADS_AHEAD && width % 4 == 0)
        gather_train_runs<4>(images, labels, index, draw, fill, out, out_labels, slots, channels, height, width, pad,
                             fits, f);
    else
        gather_train_runs<1>(images, labels, index, draw, fill, out, out_labels, slots, channels, height, width, pad,
                             fits, f);
}

// Test batch: the `len` test images from `first` on, split over the envs as Sharding::test_chunk does
// (the first len mod E envs get one more), into [E, batch] — the training batch, or as few rows as the
// largest chunk (a trimmed validation); env e's rows past its chunk are zero images labelled
// PAD_LABEL; counts[e] = its chunk's length. RUN consecutive elements of an image a thread at a time,
// their loads issued together, as gather_train_runs.
template <u32 RUN>
__device__ __forceinline__ void gather_test_runs(
    const float* images, const u8* labels, float* out, u8* out_labels, u32* counts, u64 first, u32 len, u32 envs,
    u32 batch, u32 image_len, bool fits, const FastDiv (&f)[2]) {
    u32 q = len / envs, rem = len % envs;
    FOR_EACH(run, (u64)envs * batch * image_len / RUN) {
        u64 i = run * RUN, t;
        u32 k, e, row;
        if (fits) {
            u32 tt = fdiv((u32)i, f[0]), ee = fdiv(tt, f[1]);
            t = tt, k = (u32)i - tt * image_len, e = ee, row = tt - ee * batch;
        } else {
            t = i / image_len, k = (u32)(i % image_len), e = (u32)(t / batch), row = (u32)(t % batch);
        }
        u32 n = q + (e < rem ? 1u : 0u);
        u64 start = first + (u64)e * q + (e < rem ? e : rem);
        bool real = row < n;
        const float* source = images + (real ? (start + row) * image_len + k : 0);
        float v[RUN];
#pragma unroll
        for (u32 j = 0; j < RUN; ++j) v[j] = real ? source[j] : 0.0f;
#pragma unroll
        for (u32 j = 0; j < RUN; ++j) out[i + j] = v[j];
        if (k == 0) out_labels[t] = real ? labels[start + row] : (u8)PAD_LABEL;
        if (k == 0 && row == 0) counts[e] = n;
    }
}

extern "C" __global__ void gather_test_f32(
    const float* images, const u8* labels, float* out, u8* out_labels, u32* counts, u64 first, u32 len,
    u32 envs, u32 batch, u32 image_len) {
    bool fits = FITS_U32((u64)envs * batch * image_len);
    FastDiv f[2];
    block_fast_divs<2>({image_len, batch}, f);
    if (LOADS_AHEAD && image_len % 4 == 0)
        gather_test_runs<4>(images, labels, out, out_labels, counts, first, len, envs, batch, image_len, fits, f);
    else
        gather_test_runs<1>(images, labels, out, out_labels, counts, first, len, envs, batch, image_len, fits, f);
}

// The per-env sums of a step, f64: the training epoch's [0, E) Σ batch losses and [E, 2E) Σ correct
// (a buffer of their own, copied into the step's read-back at its end); each validation pass's
// [2E, 3E) correct, [3E, 4E) total, [4E, 5E) Σ batch-mean losses and [5E, 6E) batches, in a view of the
// validation's sums buffer that starts 4E further per pass (copied into the step's read-back). Counts are whole numbers far below 2^53, so f64 holds
// them exactly.

// One training batch into the epoch's sums ([2, E]): Σ loss += loss[e] (f64, batches in order),
// Σ correct += correct[e].
extern "C" __global__ void train_epoch_accumulate(const float* loss, const u32* correct, double* sums, u32 envs) {
    FOR_EACH(e, envs) {
        sums[e] += (double)loss[e];
        sums[envs + e] += (double)correct[e];
    }
}

// One validation batch into the pass's sums, one block of REDUCE_THREADS per env (blockIdx.x): rows
// 0..counts[e] of env e shared out by thread, each row accumulate_validation's f64 arithmetic (the
// first arg-max, the cross-entropy max + ln Σ exp(z − max) − z[label]), then block_sum's fixed tree;
// correct, total, the batch mean loss and one batch added. The CPU sums the rows' losses in row order:
// the loss agrees to rounding (the counts exactly). One thread per env took 0.7 ms a batch (ncu, H100).
extern "C" __global__ void validation_accumulate_f32(
    const float* logits, const u8* labels, const u32* counts, double* sums, u32 envs, u32 batch, u32 classes) {
    __shared__ double partial[REDUCE_THREADS];
    u32 e = blockIdx.x, count = counts[e];
    if (count == 0) return;  // uniform over the block: no thread reaches block_sum
    double loss = 0.0, right = 0.0;
    for (u32 row = threadIdx.x; row < count; row += REDUCE_THREADS) {
        u64 i = (u64)e * batch + row;
        const float* z = logits + i * classes;
        u32 label = labels[i], best = 0;
        double max = (double)z[0];
        for (u32 k = 0; k < classes; ++k) {
            if ((double)z[k] > max) { best = k; max = (double)z[k]; }
        }
        double sum = 0.0;
        for (u32 k = 0; k < classes; ++k) sum += exp((double)z[k] - max);
        loss += max + log(sum) - (double)z[label];
        right += best == label ? 1.0 : 0.0;
    }
    loss = block_sum(loss, partial);
    right = block_sum(right, partial);
    if (threadIdx.x == 0) {
        sums[2 * envs + e] += right;
        sums[3 * envs + e] += (double)count;
        sums[4 * envs + e] += loss / (double)count;
        sums[5 * envs + e] += 1.0;
    }
}
